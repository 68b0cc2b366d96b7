//! `attn-bench`: `run` measures a grid of attention calls against baselines and writes JSON, a
//! markdown table and PNG plots; `check` runs one call on tensors from a safetensors file and
//! writes its outputs, statistics and gradients.

use attn_bench::check::{check, family_with_options, CheckDevice, CheckOptions, FamilyOptions};
use attn_bench::grid::{parse_families, FamilyId, GridConfig, PassKind, Preset};
use attn_bench::impls::ImplId;
use attn_bench::machine::{copy_bandwidth_gbs, cpu_name, git_commit, host_name, today};
use attn_bench::run::{run, RunConfig, RunContext};
use attn_bench::schema::BenchFile;
use attn_bench::timing::TimingConfig;
use attn_bench::{plots, report, BenchError};
use attn_core::{Aggregation, Causal, DType, Layout};
use clap::{Args, Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::str::FromStr;

#[derive(Parser)]
#[command(
    name = "attn-bench",
    version,
    about = "Benchmarks and bit-exact checks for the attn attention families"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Measure a grid (default: BENCHMARKS.md's FlashAttention convention) against baselines.
    Run(RunArgs),
    /// Run one call on q, k, v (+ do, bias, key_lens) from a safetensors file; write o, LSE or
    /// denominators and gradients to another.
    Check(CheckArgs),
}

#[derive(Args)]
struct RunArgs {
    /// Starting grid: `flash` (16k tokens per batch, hidden 2048, N 512..16384 + long N) or
    /// `cpu-small` (B=1, H=2, D=32, N 128..512 + 1024 for the crossover, f32); the options below
    /// override it.
    #[arg(long, default_value = "flash")]
    preset: String,
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
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Timed runs per point (30 or more for the published tables).
    #[arg(long, default_value_t = 30)]
    runs: usize,
    /// Skip a point whose first call predicts more than this for warm-up plus timed runs.
    #[arg(long)]
    max_point_seconds: Option<f64>,
    /// Implementations to measure: attn-cpu-ref, attn-cuda, candle_naive, or `none` to only merge.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "attn-cpu-ref,attn-cuda,candle_naive"
    )]
    impls: Vec<String>,
    /// Result files (this tool's or python/run_baselines.py's) to merge into the table and plots.
    #[arg(long, num_args = 1..)]
    merge: Vec<PathBuf>,
    #[arg(long, default_value = "bench/results")]
    out_dir: PathBuf,
    /// File stem (default `<date>-cpu-<host>` on the CPU, `<date>-<gpu>` for merged GPU results).
    #[arg(long)]
    name: Option<String>,
    #[arg(long)]
    no_plots: bool,
    /// Bandwidth ceiling for `% BW` in GB/s (default: measured copy bandwidth of this machine).
    #[arg(long)]
    bandwidth_gbs: Option<f64>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(Args)]
struct CheckArgs {
    #[arg(long)]
    input: PathBuf,
    #[arg(long)]
    output: PathBuf,
    /// softmax, cosine_sim, taylor1, taylor2, hyperbolic_geodesic, hyperbolic_sq_lorentz.
    #[arg(long)]
    family: String,
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
    /// cpu (cuda once attn-cuda can launch).
    #[arg(long, default_value = "cpu")]
    device: String,
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

fn grid_from(args: &RunArgs) -> Result<GridConfig, BenchError> {
    let preset: Preset = args.preset.parse().map_err(|e| invalid("preset", e))?;
    let mut g = GridConfig::preset(preset);
    if let Some(names) = &args.families {
        let (ok, unknown) = parse_families(names);
        for u in unknown {
            eprintln!("skipping family: {u}");
        }
        g.families = ok;
    }
    if let Some(d) = &args.dtypes {
        g.dtypes = parse_list::<DType>("dtype", d);
    }
    if let Some(p) = &args.passes {
        g.passes = parse_list::<PassKind>("pass", p);
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
    Ok(g)
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
    let grid = grid_from(&args)?;
    let impls: Vec<ImplId> = if args.impls.iter().any(|s| s == "none") {
        Vec::new()
    } else {
        parse_list("implementation", &args.impls)
    };
    if args.runs < 30 && !impls.is_empty() {
        eprintln!(
            "note: {} timed runs per point (published tables use 30 or more)",
            args.runs
        );
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
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
        let ctx = RunContext {
            device: cpu_name(),
            commit: git_commit(repo),
            date: today(),
            bandwidth_gbs: Some(args.bandwidth_gbs.unwrap_or_else(copy_bandwidth_gbs)),
        };
        let cfg = RunConfig {
            grid,
            timing: TimingConfig {
                warmup: args.warmup,
                runs: args.runs,
            },
            impls,
            seed: args.seed,
            max_point_seconds: args.max_point_seconds,
            progress: true,
        };
        let mut file = run(&cfg, &ctx);
        merged.into_iter().for_each(|f| file.merge(f));
        file
    };
    file.rows.sort_by(|a, b| {
        a.key()
            .cmp(&b.key())
            .then(a.implementation.cmp(&b.implementation))
    });

    std::fs::create_dir_all(&args.out_dir).map_err(|e| BenchError::io(&args.out_dir, e))?;
    let stem = args.name.clone().unwrap_or_else(|| {
        if file.device.starts_with("cpu") {
            format!("{}-cpu-{}", file.date, slug(&host_name()))
        } else {
            format!("{}-{}", file.date, slug(&file.device))
        }
    });
    let json = args.out_dir.join(format!("{stem}.json"));
    file.write(&json)?;
    let md_text = report::markdown(&file);
    let md = args.out_dir.join(format!("{stem}.md"));
    std::fs::write(&md, &md_text).map_err(|e| BenchError::io(&md, e))?;
    println!("{md_text}");
    println!(
        "{} rows, {} skipped, {} grid points not built",
        file.rows.len(),
        file.skipped.len(),
        file.bad_points.len()
    );
    println!("wrote {}\nwrote {}", json.display(), md.display());
    if !args.no_plots {
        match plots::write_plots(&file, &args.out_dir, &stem) {
            Ok(paths) => paths.iter().for_each(|p| println!("wrote {}", p.display())),
            Err(e) => eprintln!("plots not written: {e}"),
        }
    }
    Ok(())
}

fn cmd_check(args: CheckArgs) -> Result<(), BenchError> {
    let id: FamilyId = args.family.parse().map_err(|e| invalid("family", e))?;
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
    };
    let summary = check(
        &args.input,
        &args.output,
        &opts,
        &git_commit(Path::new(env!("CARGO_MANIFEST_DIR"))),
    )?;
    println!("{}", summary.description);
    for t in &summary.tensors {
        println!("  {t}");
    }
    println!("wrote {}", summary.output.display());
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Run(a) => cmd_run(a),
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
