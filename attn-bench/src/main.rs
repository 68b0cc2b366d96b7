//! `attn-bench`: `run` measures a plan of attention calls against baselines and writes JSON, a
//! markdown table and PNG plots (under `target/attn-bench/` unless `--out` says otherwise); `plan`
//! writes a plan's points for the python baselines; `info` says which commit and GPU this binary
//! has; `check` runs one call on tensors from a safetensors file (on the CPU reference or on
//! attn-cuda) and writes its outputs, statistics and gradients.

use attn_bench::check::{check, family_with_options, make_example, CheckDevice, CheckOptions, FamilyOptions};
use attn_bench::grid::{parse_families, FamilyId, GridPoint, PassKind};
use attn_bench::impls::{cuda_bandwidth_gbs, cuda_device, ImplId};
use attn_bench::machine::{
    attn_cuda_overrides, copy_bandwidth_gbs, cpu_name, host_name, source_commit, today, BUILD_COMMIT,
};
use attn_bench::plan::{Filter, Plan, Preset};
use attn_bench::run::{run, RunConfig, RunContext};
use attn_bench::schema::BenchFile;
use attn_bench::timing::TimingConfig;
use attn_bench::{plots, report, summary, BenchError};
use attn_core::{Aggregation, Causal, DType, Layout};
use clap::{Args, Parser, Subcommand};
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;

#[derive(Parser)]
#[command(
    name = "attn-bench",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("ATTN_BENCH_COMMIT"), ")"),
    about = "Benchmarks and bit-exact checks for the attn attention families"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Measure a plan against baselines (default: `cpu-small` on the CPU, `flash` with attn-cuda
    /// where a GPU is usable) and write JSON, markdown and plots under target/attn-bench/.
    Run(RunArgs),
    /// Write the points of a plan as JSON (what `python/run_baselines.py --points` measures).
    Plan(PlanArgs),
    /// Print this binary's commit, features and the GPU it would use.
    Info,
    /// Run one call on q, k, v (+ do, bias, key_lens) from a safetensors file on the CPU
    /// reference or attn-cuda; write o, LSE or denominators and gradients to another.
    Check(CheckArgs),
}

/// What to measure: a preset, its sections and options that narrow or replace its grid.
#[derive(Args)]
struct GridArgs {
    /// `flash` (one grid: 16k tokens per batch, hidden 2048, N 512..16384 + long N, every family),
    /// `cpu-small` (one grid: B=1, H=2, D=32, N 128..512 + 1024, f32), `h100` (sections flash,
    /// taylor, memory: the GPU programme behind docs/performance.md), `gpu-smoke` (the h100
    /// sections at toy sizes), `decode` and `decode-smoke` (KV-cache decode on a GPU, and at toy
    /// sizes), `cpu-decode` (one query against 4k-32k keys, f32 and bf16, sized for two CPU
    /// cores: attn-cpu-fast against candle_naive). On h100 and gpu-smoke the list options below keep a subset and the
    /// shape options are refused; on flash and cpu-small they replace the grid's values. Default:
    /// `run` takes cpu-small on the CPU and flash on a GPU (see --device); `plan` takes flash.
    #[arg(long)]
    preset: Option<String>,
    /// Sections of the preset to measure (h100, gpu-smoke: flash, taylor, memory).
    #[arg(long, value_delimiter = ',')]
    sections: Option<Vec<String>>,
    /// Families: softmax, cosine_sim, taylor1, taylor2, hyperbolic_geodesic, hyperbolic_sq_lorentz.
    #[arg(long, value_delimiter = ',')]
    families: Option<Vec<String>>,
    /// Storage dtypes: f32, f16, bf16.
    #[arg(long, value_delimiter = ',')]
    dtypes: Option<Vec<String>>,
    #[arg(long, value_delimiter = ',')]
    head_dims: Option<Vec<usize>>,
    /// Causal settings to measure, e.g. `false,true`.
    #[arg(long, value_delimiter = ',')]
    causal: Option<Vec<bool>>,
    /// Passes: fwd, bwd, fwd_bwd.
    #[arg(long, value_delimiter = ',')]
    passes: Option<Vec<String>>,
    /// Sequence lengths for every family.
    #[arg(long, value_delimiter = ',')]
    seq_lens: Option<Vec<usize>>,
    /// Extra sequence lengths for the linear family (and softmax, for the crossover).
    #[arg(long, value_delimiter = ',')]
    long_seq_lens: Option<Vec<usize>>,
    /// Batch size (overrides tokens / N).
    #[arg(long)]
    batch: Option<usize>,
    /// Heads (overrides hidden / D).
    #[arg(long)]
    heads: Option<usize>,
    /// Tokens per batch for the B = tokens / N convention.
    #[arg(long)]
    tokens: Option<usize>,
    /// Hidden size for the H = hidden / D convention.
    #[arg(long)]
    hidden: Option<usize>,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    grid: GridArgs,
    /// Untimed calls per point before the timed runs (at least 2 are made: the peak-memory call
    /// and the one that predicts the point's duration).
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Timed runs per point (30 or more for the published tables).
    #[arg(long, default_value_t = 30)]
    runs: usize,
    /// Skip a point whose first call predicts more than this for warm-up plus timed runs.
    #[arg(long)]
    max_point_seconds: Option<f64>,
    /// Budget of the whole run in seconds: a point that would end past it is skipped with that
    /// reason, so a long plan can be split across calls (with --sections).
    #[arg(long)]
    max_seconds: Option<f64>,
    /// Where ours runs: `cpu` (attn-cpu-ref beside the candle baseline; default preset cpu-small,
    /// minutes on two cores) or `cuda` (attn-cuda on GPU 0: needs `--features cuda`, a GPU and the
    /// kernels; default preset flash). Default: cuda where attn-cuda can run, else cpu.
    #[arg(long)]
    device: Option<String>,
    /// Implementations to measure: attn-cpu-ref, attn-cuda, candle_naive, or `none` to only merge
    /// (default: attn-cuda on h100 and on flash with --device cuda, attn-cpu-ref and attn-cuda on
    /// gpu-smoke, all three on cpu-small with --device cuda, attn-cpu-ref and candle_naive on the
    /// CPU).
    #[arg(long, value_delimiter = ',')]
    impls: Option<Vec<String>>,
    /// Result files (this tool's or python/run_baselines.py's) to merge into the table and plots.
    /// Where two of them (or a file and this run) measured the same point with the same
    /// implementation and parameters, the first wins: this run's rows, then the files in order.
    #[arg(long, num_args = 1..)]
    merge: Vec<PathBuf>,
    /// Folder for the JSON, markdown and plots (created if missing).
    #[arg(
        long,
        alias = "out-dir",
        value_name = "DIR",
        default_value = "target/attn-bench"
    )]
    out: PathBuf,
    /// File stem (default `<date>-cpu-<host>` on the CPU, `<date>-<gpu>` for GPU results).
    #[arg(long)]
    name: Option<String>,
    #[arg(long)]
    no_plots: bool,
    /// Print the short summary table (summary.rs) last instead of the whole markdown report.
    #[arg(long)]
    summary: bool,
    /// Bandwidth ceiling for `% BW` in GB/s (default: measured copy bandwidth of the device).
    #[arg(long)]
    bandwidth_gbs: Option<f64>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(Args)]
struct PlanArgs {
    #[command(flatten)]
    grid: GridArgs,
    /// Where to write the JSON (default: print it).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Args)]
struct CheckArgs {
    /// Safetensors file with q, k, v (and optionally do, bias, key_lens, cu_seqlens_q/k).
    #[arg(long, required_unless_present = "make_example")]
    input: Option<PathBuf>,
    /// Safetensors file to write o, lse or den, and with do the gradients to.
    #[arg(long, required_unless_present = "make_example")]
    output: Option<PathBuf>,
    /// Write an example input (q, k, v, do: B=2, Hq=4, Hk=2, Nq=100, Nk=128, D=64, seeded
    /// uniform values) to FILE and stop; --dtype, --layout and --family shape it.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["input", "output"])]
    make_example: Option<PathBuf>,
    /// Storage dtype of --make-example's tensors: f32, f16 or bf16 (default bf16).
    #[arg(long)]
    dtype: Option<String>,
    /// softmax, cosine_sim, taylor1, taylor2, hyperbolic_geodesic, hyperbolic_sq_lorentz.
    #[arg(long, required_unless_present = "make_example")]
    family: Option<String>,
    /// none, top-left or bottom-right.
    #[arg(long, default_value = "none")]
    causal: String,
    /// bnhd ([B, N, H, D], the default) or bhnd ([B, H, N, D]).
    #[arg(long, default_value = "bnhd")]
    layout: String,
    #[arg(long)]
    window_left: Option<usize>,
    #[arg(long)]
    window_right: Option<usize>,
    /// cpu (attn-cpu-ref: the f64 reference, rounded once) or cuda (attn-cuda: needs
    /// `--features cuda`, a GPU and the kernels; its outputs are also compared with the f64
    /// reference, printed per tensor).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// With --device cuda, skip the f64 reference on the CPU (slow for large inputs).
    #[arg(long)]
    no_reference: bool,
    #[arg(long)]
    scale: Option<f32>,
    #[arg(long)]
    softcap: Option<f32>,
    /// Taylor coefficients a0,a1[,a2].
    #[arg(long, value_delimiter = ',')]
    a: Option<Vec<f32>>,
    /// l2-normalise q and k (cosine-sim, Taylor).
    #[arg(long)]
    l2norm: Option<bool>,
    #[arg(long)]
    eps: Option<f32>,
    #[arg(long)]
    curvature: Option<f32>,
    #[arg(long)]
    beta: Option<f32>,
    /// euclidean or einstein.
    #[arg(long)]
    aggregation: Option<String>,
}

fn invalid(arg: &'static str, reason: String) -> BenchError {
    BenchError::InvalidArgument { arg, reason }
}

/// Parse every entry, reporting (and dropping) the ones that do not parse.
fn parse_list<T: FromStr<Err = String>>(what: &str, items: &[String]) -> Vec<T> {
    items
        .iter()
        .filter(|s| !s.trim().is_empty())
        .filter_map(|s| match s.trim().parse::<T>() {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("skipping {what}: {e}");
                None
            }
        })
        .collect()
}

const SHAPE_OPTIONS: &str = "--seq-lens, --long-seq-lens, --batch, --heads, --tokens, --hidden";

/// The plan the options describe, starting from `--preset` or else from `default`.
fn plan_from(args: &GridArgs, default: Preset) -> Result<(Preset, Plan), BenchError> {
    let preset = match &args.preset {
        Some(name) => name.parse().map_err(|e| invalid("preset", e))?,
        None => default,
    };
    let mut plan = Plan::preset(preset);
    if let Some(names) = &args.sections {
        plan.select(names).map_err(|e| invalid("sections", e))?;
    }
    let families = args.families.as_ref().map(|names| {
        let (ok, unknown) = parse_families(names);
        for u in unknown {
            eprintln!("skipping family: {u}");
        }
        ok
    });
    let dtypes = args.dtypes.as_ref().map(|d| parse_list::<DType>("dtype", d));
    let passes = args.passes.as_ref().map(|p| parse_list::<PassKind>("pass", p));
    let shape_given = args.seq_lens.is_some()
        || args.long_seq_lens.is_some()
        || args.batch.is_some()
        || args.heads.is_some()
        || args.tokens.is_some()
        || args.hidden.is_some();
    if plan.sections.len() != 1 || plan.sections[0].grids.len() != 1 {
        if shape_given {
            return Err(invalid(
                "preset",
                format!(
                    "{SHAPE_OPTIONS} change a single grid: use them with --preset flash or cpu-small, \
                     not with the sections of `{}`",
                    preset.label()
                ),
            ));
        }
        plan.filter(&Filter {
            families,
            dtypes,
            head_dims: args.head_dims.clone(),
            causal: args.causal.clone(),
            passes,
        });
        return Ok((preset, plan));
    }
    let g = &mut plan.sections[0].grids[0];
    if let Some(f) = families {
        g.families = f;
    }
    if let Some(d) = dtypes {
        g.dtypes = d;
    }
    if let Some(p) = passes {
        g.passes = p;
    }
    if let Some(d) = &args.head_dims {
        g.head_dims = d.clone();
    }
    if let Some(c) = &args.causal {
        g.causal = c.clone();
    }
    if let Some(n) = &args.seq_lens {
        g.seq_lens = n.clone();
    }
    if let Some(n) = &args.long_seq_lens {
        g.long_seq_lens = n.clone();
    }
    g.batch = args.batch.or(g.batch);
    g.heads = args.heads.or(g.heads);
    g.tokens = args.tokens.unwrap_or(g.tokens);
    g.hidden = args.hidden.unwrap_or(g.hidden);
    Ok((preset, plan))
}

/// Where `run` measures ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RunDevice {
    Cpu,
    Cuda,
}

impl RunDevice {
    /// The preset `run` starts from without `--preset`: one the device finishes in minutes.
    fn default_preset(self) -> Preset {
        match self {
            RunDevice::Cpu => Preset::CpuSmall,
            RunDevice::Cuda => Preset::Flash,
        }
    }
}

/// `--device` as given, or else cuda where attn-cuda can run and cpu otherwise (saying why). An
/// explicit `cuda` that cannot run is an error naming the reason.
fn resolve_device(arg: Option<&str>) -> Result<RunDevice, BenchError> {
    match arg {
        Some("cpu") => Ok(RunDevice::Cpu),
        Some("cuda") => cuda_device()
            .map(|_| RunDevice::Cuda)
            .map_err(|reason| BenchError::Unavailable {
                implementation: "attn-cuda",
                reason,
            }),
        Some(other) => Err(invalid("device", format!("`{other}` (expected cpu or cuda)"))),
        None => match cuda_device() {
            Ok(name) => {
                eprintln!("device: cuda (attn-cuda on {name}; --device cpu to measure the CPU)");
                Ok(RunDevice::Cuda)
            }
            Err(reason) => {
                eprintln!("device: cpu (attn-cuda cannot run here: {reason})");
                Ok(RunDevice::Cpu)
            }
        },
    }
}

/// The implementations a run measures without `--impls`.
fn default_impls(preset: Preset, device: RunDevice) -> Vec<ImplId> {
    match (preset, device) {
        (Preset::H100 | Preset::Decode, _) => vec![ImplId::AttnCuda],
        (Preset::CpuDecode, _) => vec![ImplId::AttnCpuFast, ImplId::CandleNaive],
        (Preset::GpuSmoke | Preset::DecodeSmoke, _) => vec![ImplId::AttnCpuRef, ImplId::AttnCuda],
        // The host implementations would take hours at the flash grid's sizes.
        (Preset::Flash, RunDevice::Cuda) => vec![ImplId::AttnCuda],
        (Preset::CpuSmall, RunDevice::Cuda) => ImplId::ALL.to_vec(),
        (Preset::Flash | Preset::CpuSmall, RunDevice::Cpu) => vec![ImplId::AttnCpuRef, ImplId::CandleNaive],
    }
}

fn slug(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches('-').to_string()
}

fn cmd_run(args: RunArgs) -> Result<(), BenchError> {
    let merge_only = args
        .impls
        .as_ref()
        .is_some_and(|list| list.iter().any(|s| s == "none"));
    // The device only picks defaults (and an explicit `cuda` must be usable): probe the GPU only
    // when something depends on it.
    let needs_device =
        args.device.is_some() || (!merge_only && (args.grid.preset.is_none() || args.impls.is_none()));
    let device = if needs_device {
        resolve_device(args.device.as_deref())?
    } else {
        RunDevice::Cpu
    };
    let (preset, plan) = plan_from(&args.grid, device.default_preset())?;
    if args.grid.preset.is_none() && !merge_only {
        eprintln!("preset: {} (--preset to choose another)", preset.label());
    }
    let impls: Vec<ImplId> = match &args.impls {
        Some(_) if merge_only => Vec::new(),
        Some(list) => parse_list("implementation", list),
        None => default_impls(preset, device),
    };
    if args.runs < 30 && !impls.is_empty() {
        eprintln!(
            "note: {} timed runs per point (published tables use 30 or more)",
            args.runs
        );
    }
    let merged: Vec<BenchFile> = args
        .merge
        .iter()
        .map(|p| BenchFile::read(p))
        .collect::<Result<_, _>>()?;

    let mut file = if impls.is_empty() {
        let mut it = merged.into_iter();
        let mut first = it
            .next()
            .ok_or_else(|| invalid("impls", "`none` needs at least one --merge file".into()))?;
        it.for_each(|f| first.merge(f));
        first
    } else {
        let gpu = if impls.contains(&ImplId::AttnCuda) {
            match cuda_device() {
                Ok(name) => Some(name),
                Err(reason) => {
                    eprintln!("attn-cuda: every point will be skipped: {reason}");
                    None
                }
            }
        } else {
            None
        };
        let host = cpu_name();
        let bandwidth_gbs = match (args.bandwidth_gbs, &gpu) {
            (Some(bw), _) => Some(bw),
            (None, Some(_)) => match cuda_bandwidth_gbs() {
                Ok(bw) => Some(bw),
                Err(e) => {
                    eprintln!("device copy bandwidth not measured ({e}); % BW left out");
                    None
                }
            },
            (None, None) => Some(copy_bandwidth_gbs()),
        };
        if let Some(bw) = bandwidth_gbs {
            eprintln!("copy bandwidth {bw:.0} GB/s");
        }
        let ctx = RunContext {
            device: gpu.unwrap_or_else(|| host.clone()),
            host,
            commit: source_commit(),
            date: today(),
            bandwidth_gbs,
            cuda_overrides: attn_cuda_overrides(),
        };
        let cfg = RunConfig {
            plan,
            timing: TimingConfig {
                warmup: args.warmup,
                runs: args.runs,
            },
            impls,
            seed: args.seed,
            max_point_seconds: args.max_point_seconds,
            max_seconds: args.max_seconds,
            progress: true,
        };
        let mut file = run(&cfg, &ctx);
        merged.into_iter().for_each(|f| file.merge(f));
        file
    };
    let (rows, skips) = file.drop_superseded();
    if rows + skips > 0 {
        eprintln!(
            "left out what an earlier input superseded: {rows} rows measured again, {skips} skips of \
             measured points (the first input wins)"
        );
    }
    file.rows.sort_by(|a, b| {
        a.key()
            .cmp(&b.key())
            .then(a.implementation.cmp(&b.implementation))
    });

    let out_dir = &args.out;
    std::fs::create_dir_all(out_dir).map_err(|e| BenchError::io(out_dir, e))?;
    let stem = args.name.clone().unwrap_or_else(|| {
        if file.device.starts_with("cpu") {
            format!("{}-cpu-{}", file.date, slug(&host_name()))
        } else {
            format!("{}-{}", file.date, slug(&file.device))
        }
    });
    let json = out_dir.join(format!("{stem}.json"));
    file.write(&json)?;
    let md_text = report::markdown(&file);
    let md = out_dir.join(format!("{stem}.md"));
    std::fs::write(&md, &md_text).map_err(|e| BenchError::io(&md, e))?;
    if !args.summary {
        println!("{md_text}");
        println!(
            "{} rows, {} skipped, {} grid points not built",
            file.rows.len(),
            file.skipped.len(),
            file.bad_points.len()
        );
    }
    println!("wrote {}\nwrote {}", json.display(), md.display());
    if !args.no_plots {
        match plots::write_plots(&file, out_dir, &stem) {
            Ok(paths) => paths.iter().for_each(|p| println!("wrote {}", p.display())),
            Err(e) => eprintln!("plots not written: {e}"),
        }
    }
    if args.summary {
        print!("{}", summary::summary(&file));
    }
    Ok(())
}

/// One point of `attn-bench plan`'s JSON.
#[derive(Serialize)]
struct PlanPoint<'a> {
    section: &'a str,
    family: &'static str,
    dtype: &'static str,
    pass: &'static str,
    batch: usize,
    heads_q: usize,
    heads_kv: usize,
    /// Keys per sequence (`seq_k`; kept for readers of the self-attention plans).
    seq: usize,
    seq_q: usize,
    seq_k: usize,
    head_dim: usize,
    /// Causal: top-left where `seq_q = seq_k`, bottom-right otherwise.
    causal: bool,
    /// The page size of a paged KV cache (decode-paged points only).
    #[serde(skip_serializing_if = "Option::is_none")]
    page_size: Option<usize>,
}

#[derive(Serialize)]
struct PlanFile<'a> {
    preset: &'static str,
    sections: Vec<&'a str>,
    points: Vec<PlanPoint<'a>>,
    bad_points: Vec<String>,
}

fn plan_point<'a>(section: &'a str, p: &GridPoint) -> PlanPoint<'a> {
    PlanPoint {
        section,
        family: p.family.label(),
        dtype: p.dtype.name(),
        pass: p.pass.label(),
        batch: p.batch,
        heads_q: p.heads_q,
        heads_kv: p.heads_kv,
        seq: p.seq,
        seq_q: p.seq_q,
        seq_k: p.seq,
        head_dim: p.head_dim,
        causal: p.causal,
        page_size: p.page_size,
    }
}

fn cmd_plan(args: PlanArgs) -> Result<(), BenchError> {
    let (preset, plan) = plan_from(&args.grid, Preset::Flash)?;
    let (points, bad) = plan.points();
    let out = PlanFile {
        preset: preset.label(),
        sections: plan.section_names(),
        points: points.iter().map(|p| plan_point(p.section, &p.point)).collect(),
        bad_points: bad.iter().map(|b| format!("{}: {}", b.what, b.reason)).collect(),
    };
    let text = serde_json::to_string_pretty(&out)?;
    match &args.out {
        Some(path) => {
            std::fs::write(path, text + "\n").map_err(|e| BenchError::io(path, e))?;
            for name in plan.section_names() {
                let n = points.iter().filter(|p| p.section == name).count();
                eprintln!("section {name}: {n} points");
            }
            eprintln!("wrote {}", path.display());
        }
        None => println!("{text}"),
    }
    Ok(())
}

fn cmd_info() -> Result<(), BenchError> {
    println!("commit: {}", source_commit());
    println!("built from: {BUILD_COMMIT}");
    println!(
        "cuda feature: {}",
        if cfg!(feature = "cuda") { "on" } else { "off" }
    );
    match cuda_device() {
        Ok(name) => println!("attn-cuda: ready on {name}"),
        Err(reason) => println!("attn-cuda: unavailable: {reason}"),
    }
    println!("host: {}", cpu_name());
    Ok(())
}

fn cmd_check(args: CheckArgs) -> Result<(), BenchError> {
    let id: FamilyId = match (&args.family, &args.make_example) {
        (Some(name), _) => name.parse().map_err(|e| invalid("family", e))?,
        // The example's values are drawn for softmax unless a family is named.
        (None, Some(_)) => FamilyId::Softmax,
        (None, None) => return Err(invalid("family", "is required".into())),
    };
    let aggregation = match args.aggregation.as_deref() {
        None => None,
        Some("euclidean") => Some(Aggregation::Euclidean),
        Some("einstein") => Some(Aggregation::EinsteinMidpoint),
        Some(other) => {
            return Err(invalid(
                "aggregation",
                format!("`{other}` (expected euclidean or einstein)"),
            ))
        }
    };
    let family = family_with_options(
        id,
        &FamilyOptions {
            scale: args.scale,
            softcap: args.softcap,
            a: args.a.clone(),
            l2norm: args.l2norm,
            eps: args.eps,
            curvature: args.curvature,
            beta: args.beta,
            aggregation,
        },
    )?;
    let causal = match args.causal.as_str() {
        "none" => Causal::None,
        "top-left" => Causal::TopLeft,
        "bottom-right" => Causal::BottomRight,
        other => {
            return Err(invalid(
                "causal",
                format!("`{other}` (expected none, top-left, bottom-right)"),
            ))
        }
    };
    let layout = match args.layout.as_str() {
        "bnhd" => Layout::Bnhd,
        "bhnd" => Layout::Bhnd,
        other => return Err(invalid("layout", format!("`{other}` (expected bnhd or bhnd)"))),
    };
    if let Some(path) = &args.make_example {
        let dtype: DType = args
            .dtype
            .as_deref()
            .unwrap_or("bf16")
            .parse()
            .map_err(|e| invalid("dtype", e))?;
        let tensors = make_example(path, family, dtype, layout)?;
        for t in &tensors {
            println!("  {t}");
        }
        println!("wrote {}", path.display());
        return Ok(());
    }
    if let Some(dtype) = &args.dtype {
        return Err(invalid(
            "dtype",
            format!("`{dtype}` applies to --make-example only (the input's q sets the dtype)"),
        ));
    }
    let (Some(input), Some(output)) = (&args.input, &args.output) else {
        return Err(invalid("input", "--input and --output are required".into()));
    };
    let device = match args.device.as_str() {
        "cpu" => CheckDevice::Cpu,
        "cuda" => CheckDevice::Cuda,
        other => return Err(invalid("device", format!("`{other}` (expected cpu or cuda)"))),
    };
    let window = (args.window_left.is_some() || args.window_right.is_some())
        .then_some((args.window_left, args.window_right));
    let opts = CheckOptions {
        family,
        layout,
        causal,
        window,
        device,
        reference: !args.no_reference,
    };
    let summary = check(input, output, &opts, &source_commit())?;
    println!("{}", summary.description);
    for t in &summary.tensors {
        println!("  {t}");
    }
    for c in &summary.comparisons {
        println!("  {c}");
    }
    println!("wrote {}", summary.output.display());
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Run(a) => cmd_run(a),
        Cmd::Plan(a) => cmd_plan(a),
        Cmd::Info => cmd_info(),
        Cmd::Check(a) => cmd_check(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("attn-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_keep_a_run_to_minutes_on_its_device() {
        assert_eq!(RunDevice::Cpu.default_preset(), Preset::CpuSmall);
        assert_eq!(RunDevice::Cuda.default_preset(), Preset::Flash);
        let host = vec![ImplId::AttnCpuRef, ImplId::CandleNaive];
        assert_eq!(default_impls(Preset::CpuSmall, RunDevice::Cpu), host);
        assert_eq!(default_impls(Preset::Flash, RunDevice::Cpu), host);
        assert_eq!(
            default_impls(Preset::Flash, RunDevice::Cuda),
            vec![ImplId::AttnCuda]
        );
        assert_eq!(
            default_impls(Preset::CpuSmall, RunDevice::Cuda),
            ImplId::ALL.to_vec()
        );
        for device in [RunDevice::Cpu, RunDevice::Cuda] {
            assert_eq!(
                default_impls(Preset::CpuDecode, device),
                vec![ImplId::AttnCpuFast, ImplId::CandleNaive]
            );
            assert_eq!(default_impls(Preset::H100, device), vec![ImplId::AttnCuda]);
            assert_eq!(
                default_impls(Preset::GpuSmoke, device),
                vec![ImplId::AttnCpuRef, ImplId::AttnCuda]
            );
        }
    }

    #[test]
    fn run_and_check_parse_their_new_options() {
        let cli =
            Cli::try_parse_from(["attn-bench", "run", "--device", "cuda", "--out", "x"]).expect("parses");
        let Cmd::Run(a) = cli.cmd else { panic!("run") };
        assert_eq!((a.device.as_deref(), a.out), (Some("cuda"), PathBuf::from("x")));
        assert!(a.grid.preset.is_none());
        let cli = Cli::try_parse_from(["attn-bench", "run", "--out-dir", "y"])
            .expect("`--out-dir` is accepted too");
        let Cmd::Run(a) = cli.cmd else { panic!("run") };
        assert_eq!(a.out, PathBuf::from("y"));
        let cli = Cli::try_parse_from(["attn-bench", "run"]).expect("parses");
        let Cmd::Run(a) = cli.cmd else { panic!("run") };
        assert_eq!(a.out, PathBuf::from("target/attn-bench"));
        let cli =
            Cli::try_parse_from(["attn-bench", "check", "--make-example", "e.safetensors"]).expect("parses");
        let Cmd::Check(a) = cli.cmd else { panic!("check") };
        assert_eq!(a.make_example, Some(PathBuf::from("e.safetensors")));
        assert!(a.input.is_none() && a.family.is_none());
        assert!(Cli::try_parse_from(["attn-bench", "check", "--input", "a", "--family", "softmax"]).is_err());
    }
}
