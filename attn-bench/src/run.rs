//! `attn-bench run`: measure every (plan point, implementation) pair and collect rows.
//!
//! Per pair: set-up and one call (synchronised) under the peak-memory measurement — the
//! implementation's own for a device, else [`PeakMemory`] on the host — then one more synchronised
//! call whose duration predicts the rest, the remaining warm-up (at least these two calls are
//! always made), and `runs` timed calls ([`Runner::time`]: host clock or CUDA events) summarised by
//! [`summarize`]. Anything that stops a pair — an implementation missing from the build or the
//! machine, an `Unsupported` error, a failure or a panic inside the implementation, a pair slower
//! than the per-point budget allows or that would end past the run's `max_seconds` — becomes a
//! [`Skipped`] entry with its reason, and the run goes on with the next pair.

use crate::error::BenchError;
use crate::flops::{bandwidth_pct, bytes_moved, pass_flops, tflops, tokens_per_s};
use crate::grid::GridPoint;
use crate::impls::{family_params, prepare, ImplId, Peak, Runner};
use crate::machine::PeakMemory;
use crate::plan::Plan;
use crate::schema::{BenchFile, Row, Skipped};
use crate::timing::{summarize, TimingConfig};
use attn_core::AttnSpec;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// Everything a run needs besides the grid's own description of the machine.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub plan: Plan,
    pub timing: TimingConfig,
    pub impls: Vec<ImplId>,
    pub seed: u64,
    /// Skip a pair whose first call predicts more than this many seconds for warm-up plus runs.
    pub max_point_seconds: Option<f64>,
    /// The whole run's budget: a pair that would end past it is skipped (so is every later one).
    pub max_seconds: Option<f64>,
    /// Show a progress bar (on a terminal).
    pub progress: bool,
}

/// What the environment contributes to every row.
#[derive(Clone, Debug)]
pub struct RunContext {
    /// The file's device: the GPU's name when attn-cuda runs, else the host CPU.
    pub device: String,
    /// The host CPU (`cpu: <model> (<n> threads)`): the `gpu` field of host implementations' rows.
    pub host: String,
    pub commit: String,
    pub date: String,
    /// Ceiling for `bandwidth_pct`, GB/s.
    pub bandwidth_gbs: Option<f64>,
    /// attn-cuda's settings from the environment ([`crate::machine::attn_cuda_overrides`]), appended to
    /// the `params` of attn-cuda's rows (` env: ...`) where not empty.
    pub cuda_overrides: String,
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".into()
    }
}

/// Run `f`, turning a panic inside an implementation into an error with its message.
fn guarded<T>(f: impl FnOnce() -> Result<T, BenchError>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) => Err(e.to_string()),
        Err(payload) => Err(format!("panicked: {}", panic_message(payload))),
    }
}

/// What one measured pair produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    /// Timed runs, ms.
    pub samples: Vec<f64>,
    pub peak: Option<Peak>,
    /// The device the calls ran on (`None`: the host CPU).
    pub device: Option<String>,
    /// `host_clock` or `cuda_event`.
    pub timer: &'static str,
}

fn measure(
    cfg: &RunConfig,
    id: ImplId,
    point: &GridPoint,
    spec: &AttnSpec,
    deadline: Option<Instant>,
) -> Result<Measured, String> {
    let budget_left = |d: Instant| d.saturating_duration_since(Instant::now());
    if deadline.is_some_and(|d| budget_left(d).is_zero()) {
        return Err(past_budget(cfg));
    }
    let mem = PeakMemory::start();
    let mut runner: Box<dyn Runner> = guarded(|| prepare(id, point, spec, cfg.seed))?;
    guarded(|| {
        runner.call()?;
        runner.sync()
    })?;
    let peak = runner.peak().or_else(|| {
        mem.as_ref().and_then(PeakMemory::peak_mib).map(|mib| Peak {
            mib,
            source: "rss_hwm_delta",
        })
    });
    let t = Instant::now();
    guarded(|| {
        runner.call()?;
        runner.sync()
    })?;
    let call_s = t.elapsed().as_secs_f64();
    let warmup = cfg.timing.warmup.saturating_sub(2);
    let remaining = warmup + cfg.timing.runs;
    let estimate = call_s * remaining as f64;
    if let Some(budget) = cfg.max_point_seconds {
        if estimate > budget {
            return Err(format!(
                "one call took {call_s:.3} s: {remaining} more would take ~{estimate:.0} s, over the {budget} s per-point budget"
            ));
        }
    }
    if let Some(d) = deadline {
        if Duration::from_secs_f64(estimate) > budget_left(d) {
            return Err(format!(
                "{} (this pair needs ~{estimate:.1} s, {:.1} s are left)",
                past_budget(cfg),
                budget_left(d).as_secs_f64()
            ));
        }
    }
    let samples = guarded(|| {
        for _ in 0..warmup {
            runner.call()?;
        }
        runner.sync()?;
        runner.time(cfg.timing.runs)
    })?;
    Ok(Measured {
        samples,
        peak,
        device: runner.device(),
        timer: runner.timer(),
    })
}

fn past_budget(cfg: &RunConfig) -> String {
    format!(
        "would end past the run's --max-seconds budget of {} s (measure it in another run, e.g. with --sections)",
        cfg.max_seconds.unwrap_or(0.0)
    )
}

fn skipped(id: ImplId, p: &GridPoint, reason: String) -> Skipped {
    Skipped {
        implementation: p.impl_label(id.label()),
        family: p.family.label().into(),
        dtype: p.dtype.name().into(),
        pass: p.pass.label().into(),
        batch: p.batch,
        heads_q: p.heads_q,
        heads_kv: p.heads_kv,
        seq_q: p.seq_q,
        seq_k: p.seq,
        head_dim: p.head_dim,
        causal: p.causal,
        reason,
    }
}

/// Build the row of a measured pair; `None` when the samples cannot be summarised.
pub fn make_row(ctx: &RunContext, id: ImplId, p: &GridPoint, spec: &AttnSpec, m: &Measured) -> Option<Row> {
    let stats = summarize(&m.samples)?;
    let shape = p.shape();
    let flops = pass_flops(p.family, p.pass, &shape);
    // Compulsory bytes where memory bounds the call: the linear family, and decode points (the KV
    // cache read once, q read and o written: % of the copy bandwidth).
    let bytes = (p.family.is_linear() || p.is_decode()).then(|| bytes_moved(p.pass, &shape, p.dtype.size()));
    Some(Row {
        implementation: p.impl_label(id.label()),
        family: p.family.label().into(),
        params: match id {
            ImplId::AttnCuda if !ctx.cuda_overrides.is_empty() => {
                format!("{} env: {}", family_params(spec), ctx.cuda_overrides)
            }
            _ => family_params(spec),
        },
        dtype: p.dtype.name().into(),
        pass: p.pass.label().into(),
        batch: p.batch,
        heads_q: p.heads_q,
        heads_kv: p.heads_kv,
        seq_q: p.seq_q,
        seq_k: p.seq,
        head_dim: p.head_dim,
        causal: p.causal,
        ms_median: stats.median,
        ms_min: stats.min,
        tflops: tflops(flops, stats.median),
        tokens_per_s: tokens_per_s(&shape, stats.median),
        peak_mib: m.peak.map(|p| p.mib),
        gpu: m.device.clone().unwrap_or_else(|| ctx.host.clone()),
        commit: ctx.commit.clone(),
        date: ctx.date.clone(),
        ms_spread: Some(stats.spread),
        runs: Some(stats.runs),
        bytes_moved: bytes,
        bandwidth_pct: bytes
            .zip(ctx.bandwidth_gbs)
            .map(|(b, bw)| bandwidth_pct(b, stats.median, bw * 1e9)),
        peak_source: m.peak.map(|p| p.source.into()),
        timer: Some(m.timer.into()),
    })
}

/// Measure the grid. Reasons for skips and bad points are printed once each (above the progress
/// bar) and recorded in the returned file.
pub fn run(cfg: &RunConfig, ctx: &RunContext) -> BenchFile {
    let mut file = BenchFile::new(ctx.device.clone(), ctx.commit.clone(), ctx.date.clone());
    file.bandwidth_gbs = ctx.bandwidth_gbs;
    let deadline = cfg
        .max_seconds
        .map(|s| Instant::now() + Duration::from_secs_f64(s.max(0.0)));
    let (points, bad) = cfg.plan.points();
    for b in bad {
        eprintln!("skipping grid point {}: {}", b.what, b.reason);
        file.bad_points.push(format!("{}: {}", b.what, b.reason));
    }
    let total = (points.len() * cfg.impls.len()) as u64;
    let bar = if cfg.progress {
        ProgressBar::new(total)
    } else {
        ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden())
    };
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} eta {eta} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut reported = HashSet::new();
    for planned in &points {
        let p = &planned.point;
        let spec = match p.spec() {
            Ok(s) => s,
            Err(e) => {
                // points() keeps only points whose spec validates; keep going all the same.
                file.bad_points.push(format!("{p}: {e}"));
                continue;
            }
        };
        for &id in &cfg.impls {
            bar.set_message(format!("{id} [{}] {p}", planned.section));
            match measure(cfg, id, p, &spec, deadline) {
                Ok(m) => match make_row(ctx, id, p, &spec, &m) {
                    Some(row) => file.rows.push(row),
                    None => file
                        .skipped
                        .push(skipped(id, p, "no finite timing samples".into())),
                },
                Err(reason) => {
                    if reported.insert((id, reason.clone())) {
                        let line = format!("{id}: skipped ({p}): {reason}");
                        // A hidden bar (no terminal) drops println: write to stderr directly.
                        if bar.is_hidden() {
                            eprintln!("{line}");
                        } else {
                            bar.println(line);
                        }
                    }
                    file.skipped.push(skipped(id, p, reason));
                }
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    file
}
