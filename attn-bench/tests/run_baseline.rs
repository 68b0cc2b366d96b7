//! A tiny `run` on the CPU produces rows, a table, plots and a JSON that round-trips; and the
//! `candle_naive` baseline computes the same attention as the reference (so ratios compare like
//! with like).

use attn_bench::grid::{FamilyId, GridConfig, PassKind};
use attn_bench::impls::candle_naive::Composite;
use attn_bench::impls::ImplId;
use attn_bench::plan::{Plan, Preset};
use attn_bench::run::{run, RunConfig, RunContext};
use attn_bench::schema::BenchFile;
use attn_bench::timing::TimingConfig;
use attn_bench::{plots, report};
use attn_core::{AttnProblem, AttnSpec, Causal, DType, Family, HypScore};
use attn_cpu_ref::testing::{max_abs, max_abs_diff, random_case};
use attn_cpu_ref::{backward_f64, forward_f64};
use candle_core::{Device, Tensor, Var};

fn tiny_grid() -> GridConfig {
    let mut g = GridConfig::cpu_small();
    g.families = vec![FamilyId::Softmax, FamilyId::Taylor2];
    g.head_dims = vec![16, 48];
    g.hidden = 96;
    g.heads = None;
    g.seq_lens = vec![32, 64];
    g.long_seq_lens = vec![];
    g.passes = vec![PassKind::Fwd, PassKind::FwdBwd, PassKind::Bwd];
    g
}

#[test]
fn tiny_cpu_run_produces_rows_table_and_plots() {
    let cfg = RunConfig {
        plan: Plan::single(tiny_grid()),
        timing: TimingConfig { warmup: 1, runs: 3 },
        impls: vec![ImplId::AttnCpuRef, ImplId::CandleNaive, ImplId::AttnCuda],
        seed: 1,
        max_point_seconds: None,
        max_seconds: None,
        progress: false,
    };
    let ctx = RunContext {
        device: "cpu: test".into(),
        host: "cpu: test".into(),
        commit: "test".into(),
        date: "2026-01-01".into(),
        bandwidth_gbs: Some(10.0),
        cuda_overrides: "ATTN_CUDA_TAYLOR1_CHAIN_RES=1".into(),
    };
    let file = run(&cfg, &ctx);
    // 2 families × 2 D × 2 N × 3 passes = 24 points; both host implementations measure every one.
    let host_rows = file
        .rows
        .iter()
        .filter(|r| r.implementation != "attn-cuda")
        .count();
    assert_eq!(host_rows, 48, "skipped: {:?}", file.skipped);
    // attn-cuda's settings from the environment mark its own rows only.
    for r in &file.rows {
        let marked = r.params.ends_with(" env: ATTN_CUDA_TAYLOR1_CHAIN_RES=1");
        assert_eq!(
            marked,
            r.implementation == "attn-cuda",
            "{}: {}",
            r.implementation,
            r.params
        );
    }
    // Without a GPU (CI), attn-cuda is skipped at every point with the reason, never a row.
    if let Err(reason) = attn_bench::impls::cuda_device() {
        assert!(!reason.is_empty());
        assert!(file.rows.iter().all(|r| r.implementation != "attn-cuda"));
        assert_eq!(file.skipped.len(), 24);
        for s in &file.skipped {
            assert_eq!(s.implementation, "attn-cuda");
            assert!(s.reason.contains(&reason), "{} vs {reason}", s.reason);
        }
    }
    assert!(file.bad_points.is_empty());
    for r in &file.rows {
        assert!(r.ms_median >= r.ms_min && r.ms_min > 0.0, "{r:?}");
        assert!(r.tflops > 0.0 && r.tokens_per_s > 0.0);
        assert_eq!(r.runs, Some(3));
        assert_eq!(r.bytes_moved.is_some(), r.family == "taylor2");
        assert_eq!(r.bandwidth_pct.is_some(), r.family == "taylor2");
        assert_eq!(r.heads_q * r.head_dim, 96);
        if r.implementation != "attn-cuda" {
            assert_eq!(r.timer.as_deref(), Some("host_clock"));
            assert_eq!(r.gpu, "cpu: test");
        }
    }

    let back = BenchFile::from_json(&file.to_json().expect("serialise")).expect("parse");
    assert_eq!(back, file);

    let md = report::markdown(&file);
    for needle in [
        "## softmax",
        "## taylor2",
        "×candle_naive",
        "% BW",
        "**attn-cuda**",
        "crossover",
    ] {
        assert!(md.contains(needle), "missing {needle}:\n{md}");
    }

    let dir = std::env::temp_dir().join(format!("attn-bench-plots-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let written = plots::write_plots(&file, &dir, "tiny").expect("plots");
    // Two slices (D = 16, 48) × (time, TFLOP/s), plus main, memory (when measurable), crossover.
    assert!(written.len() >= 6, "{written:?}");
    assert_eq!(written[0], dir.join("tiny.png"));
    for p in &written {
        let bytes = std::fs::read(p).expect("plot written");
        assert!(bytes.starts_with(b"\x89PNG"), "{}", p.display());
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// `run` of attn-cpu-ref alone over `plan` (no warm-up, two timed runs, seed 0) within the run
/// budget `max_seconds`.
fn run_cpu_ref(plan: Plan, max_seconds: Option<f64>) -> BenchFile {
    let cfg = RunConfig {
        plan,
        timing: TimingConfig { warmup: 0, runs: 2 },
        impls: vec![ImplId::AttnCpuRef],
        seed: 0,
        max_point_seconds: None,
        max_seconds,
        progress: false,
    };
    let ctx = RunContext {
        device: "cpu".into(),
        host: "cpu".into(),
        commit: "c".into(),
        date: "d".into(),
        bandwidth_gbs: None,
        cuda_overrides: String::new(),
    };
    run(&cfg, &ctx)
}

#[test]
fn impossible_points_are_recorded_and_the_rest_measured() {
    let mut grid = tiny_grid();
    grid.families = vec![FamilyId::Softmax];
    grid.head_dims = vec![16, 40]; // 96 is not a multiple of 40
    grid.seq_lens = vec![0, 32];
    grid.passes = vec![PassKind::Fwd];
    let file = run_cpu_ref(Plan::single(grid), None);
    assert_eq!(file.rows.len(), 1);
    assert_eq!(file.bad_points.len(), 3, "{:?}", file.bad_points);
}

#[test]
fn a_run_budget_skips_what_would_not_fit_with_the_reason() {
    let mut plan = Plan::preset(Preset::GpuSmoke);
    plan.select(&["memory".into()]).expect("a gpu-smoke section");
    let file = run_cpu_ref(plan, Some(0.0));
    assert!(file.rows.is_empty());
    // Softmax, Taylor order 1 and 2: one causal fwd_bwd point each.
    assert_eq!(file.skipped.len(), 3);
    assert!(file
        .skipped
        .iter()
        .all(|s| s.reason.contains("--max-seconds") && s.pass == "fwd_bwd" && s.causal));
}

/// q, k, v as `[B, H, N, D]` candle tensors from a Bnhd f64 case.
fn bhnd(spec: &AttnSpec, x: &[f64], heads: usize, seq: usize) -> Tensor {
    Tensor::from_vec(
        x.to_vec(),
        (spec.batch(), seq, heads, spec.head_dim()),
        &Device::Cpu,
    )
    .and_then(|t| t.transpose(1, 2))
    .and_then(|t| t.contiguous())
    .and_then(|t| t.to_dtype(candle_core::DType::F32))
    .expect("tensor")
}

fn flat(t: &Tensor) -> Vec<f64> {
    t.transpose(1, 2)
        .and_then(|t| t.contiguous())
        .and_then(|t| t.to_dtype(candle_core::DType::F64))
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f64>())
        .expect("to vec")
}

#[test]
fn candle_composite_matches_the_reference_forward_and_gradients() {
    let families = [
        Family::softmax(),
        Family::cosine_sim(),
        Family::taylor(1),
        Family::taylor(2),
        Family::hyperbolic(HypScore::Geodesic, attn_core::Aggregation::Euclidean),
        Family::hyperbolic(HypScore::SquaredLorentz, attn_core::Aggregation::Euclidean),
    ];
    for family in families {
        for causal in [Causal::None, Causal::TopLeft] {
            let spec = AttnProblem::new(family, DType::F32, 2, 4, 2, 9, 9, 8)
                .with_causal(causal)
                .validate()
                .expect("valid");
            let case = random_case(&spec, 11);
            let f = forward_f64(&spec, case.inputs()).expect("reference forward");
            let g =
                backward_f64(&spec, case.inputs(), &f.o, &case.d_o, &f.stats).expect("reference backward");

            let comp = Composite::new(&spec, &Device::Cpu).expect("composite");
            let q = Var::from_tensor(&bhnd(&spec, &case.q, 4, 9)).expect("var");
            let k = Var::from_tensor(&bhnd(&spec, &case.k, 2, 9)).expect("var");
            let v = Var::from_tensor(&bhnd(&spec, &case.v, 2, 9)).expect("var");
            let d_o = bhnd(&spec, &case.d_o, 4, 9);
            let o_fast = comp.forward(&q, &k, &v, false).expect("forward");
            let o = comp.forward(&q, &k, &v, true).expect("forward");
            let grads = (&o * &d_o)
                .and_then(|l| l.sum_all())
                .and_then(|l| l.backward())
                .expect("backward");
            let tol = |x: &[f64]| 1e-4 * (1.0 + max_abs(x));
            let label = format!("{family:?} {causal:?}");
            for (name, got, want) in [
                ("o (fused softmax)", flat(&o_fast), &f.o),
                ("o", flat(&o), &f.o),
                ("dq", flat(grads.get(&q).expect("dq")), &g.dq),
                ("dk", flat(grads.get(&k).expect("dk")), &g.dk),
                ("dv", flat(grads.get(&v).expect("dv")), &g.dv),
            ] {
                let err = max_abs_diff(&got, want);
                assert!(err <= tol(want), "{label}: {name} differs by {err:e}");
            }
        }
    }
}
