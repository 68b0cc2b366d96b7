//! `check` reproduces attn-cpu-ref bit for bit through a safetensors round trip, `check --device
//! cuda` runs attn-cuda where it can and otherwise says why, and the command line handles `run` and
//! `check` end to end.

use attn_bench::check::{check, cuda_ready, CheckDevice, CheckOptions};
use attn_bench::BenchError;
use attn_core::{bf16, f16, AttnProblem, AttnSpec, Causal, DType, Element, Family, HypScore, Layout};
use attn_cpu_ref::testing::random_case;
use attn_cpu_ref::{backward, forward, Inputs};
use safetensors::tensor::TensorView;
use safetensors::{Dtype as StDtype, SafeTensors};
use std::path::{Path, PathBuf};
use std::process::Command;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("attn-bench-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

trait Le: Element {
    const ST: StDtype;
    fn bytes(xs: &[Self]) -> Vec<u8>;
}
impl Le for f32 {
    const ST: StDtype = StDtype::F32;
    fn bytes(xs: &[Self]) -> Vec<u8> {
        xs.iter().flat_map(|x| x.to_le_bytes()).collect()
    }
}
impl Le for f16 {
    const ST: StDtype = StDtype::F16;
    fn bytes(xs: &[Self]) -> Vec<u8> {
        xs.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect()
    }
}
impl Le for bf16 {
    const ST: StDtype = StDtype::BF16;
    fn bytes(xs: &[Self]) -> Vec<u8> {
        xs.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect()
    }
}

fn narrow<E: Element>(x: &[f64]) -> Vec<E> {
    x.iter().map(|&v| E::from_f64(v)).collect()
}

/// Write the case's tensors, run `check`, and compare every output with attn-cpu-ref called
/// directly on the same storage-dtype values: they must be identical bit for bit.
fn round_trip<E: Le>(spec: &AttnSpec, opts: &CheckOptions, key_lens: Option<&[usize]>, name: &str) {
    let case = random_case(spec, 7);
    let (q, k, v, d_o) = (
        narrow::<E>(&case.q),
        narrow::<E>(&case.k),
        narrow::<E>(&case.v),
        narrow::<E>(&case.d_o),
    );
    let bias = case.bias.as_deref().map(narrow::<E>);
    let x = Inputs {
        q: &q,
        k: &k,
        v: &v,
        bias: bias.as_deref(),
    };
    let f = forward(spec, x).expect("reference forward");
    let g = backward(spec, x, &f.o, &d_o, &f.stats).expect("reference backward");

    let dir = scratch(name);
    let (input, output) = (dir.join("in.safetensors"), dir.join("out.safetensors"));
    let mut tensors: Vec<(String, StDtype, Vec<usize>, Vec<u8>)> = vec![
        ("q".into(), E::ST, spec.q_shape(), E::bytes(&q)),
        ("k".into(), E::ST, spec.k_shape(), E::bytes(&k)),
        ("v".into(), E::ST, spec.v_shape(), E::bytes(&v)),
        ("do".into(), E::ST, spec.o_shape(), E::bytes(&d_o)),
    ];
    if let (Some(b), Some(bs)) = (&bias, spec.bias()) {
        tensors.push((
            "bias".into(),
            E::ST,
            vec![bs.batch, bs.heads, spec.seq_q(), spec.seq_k()],
            E::bytes(b),
        ));
    }
    if let Some(lens) = key_lens {
        let data: Vec<u8> = lens.iter().flat_map(|&l| (l as i64).to_le_bytes()).collect();
        tensors.push(("key_lens".into(), StDtype::I64, vec![lens.len()], data));
    }
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, dt, shape, data)| {
            (
                n.clone(),
                TensorView::new(*dt, shape.clone(), data).expect("view"),
            )
        })
        .collect();
    safetensors::tensor::serialize_to_file(views, None, &input).expect("write input");

    let summary = check(&input, &output, opts, "test").expect("check runs");
    assert!(
        summary.tensors.iter().any(|t| t.starts_with("dq ")),
        "{summary:?}"
    );

    let bytes = std::fs::read(&output).expect("read output");
    let st = SafeTensors::deserialize(&bytes).expect("parse output");
    let stats_name = if spec.family().is_softmax_like() {
        "lse"
    } else {
        "den"
    };
    let expect: Vec<(&str, Vec<u8>)> = vec![
        ("o", E::bytes(&f.o)),
        (stats_name, f32::bytes(&f.stats)),
        ("dq", E::bytes(&g.dq)),
        ("dk", E::bytes(&g.dk)),
        ("dv", E::bytes(&g.dv)),
    ];
    for (n, want) in expect {
        let t = st
            .tensor(n)
            .unwrap_or_else(|_| panic!("{name}: output has no `{n}`"));
        assert_eq!(t.data(), &want[..], "{name}: `{n}` differs from attn-cpu-ref");
    }
    assert_eq!(st.tensor("o").expect("o").shape(), &spec.o_shape()[..]);
    assert_eq!(st.tensor("dq").expect("dq").shape(), &spec.q_shape()[..]);
    match (g.dbias, spec.bias()) {
        (Some(db), Some(_)) => assert_eq!(st.tensor("dbias").expect("dbias").data(), &E::bytes(&db)[..]),
        _ => assert!(st.tensor("dbias").is_err()),
    }
    let _ = std::fs::remove_dir_all(dir);
}

fn opts(family: Family, layout: Layout, causal: Causal) -> CheckOptions {
    CheckOptions {
        family,
        layout,
        causal,
        window: None,
        device: CheckDevice::Cpu,
        reference: true,
    }
}

#[test]
fn check_softmax_with_bias_key_padding_and_bottom_right_causal_matches_reference() {
    let o = opts(Family::softmax(), Layout::Bnhd, Causal::BottomRight);
    let spec = AttnProblem::new(o.family, DType::F32, 2, 4, 2, 5, 9, 8)
        .with_causal(o.causal)
        .with_bias(1, 4)
        .with_key_lens(vec![9, 6])
        .validate()
        .expect("valid spec");
    round_trip::<f32>(&spec, &o, Some(&[9, 6]), "softmax");
}

#[test]
fn check_taylor2_causal_bhnd_bf16_matches_reference() {
    let o = opts(Family::taylor(2), Layout::Bhnd, Causal::TopLeft);
    let spec = AttnProblem::new(o.family, DType::BF16, 1, 2, 2, 12, 12, 8)
        .with_layout(Layout::Bhnd)
        .with_causal(o.causal)
        .validate()
        .expect("valid spec");
    round_trip::<bf16>(&spec, &o, None, "taylor2");
}

#[test]
fn check_hyperbolic_geodesic_gqa_f16_matches_reference() {
    let family = Family::hyperbolic(HypScore::Geodesic, attn_core::Aggregation::Euclidean);
    let o = opts(family, Layout::Bnhd, Causal::None);
    let spec = AttnProblem::new(family, DType::F16, 2, 4, 1, 6, 7, 8)
        .validate()
        .expect("valid spec");
    round_trip::<f16>(&spec, &o, None, "hyperbolic");
}

#[test]
fn check_rejects_missing_and_mismatched_tensors() {
    let dir = scratch("bad");
    let input = dir.join("in.safetensors");
    let zeros = |shape: &[usize]| vec![0u8; 4 * shape.iter().product::<usize>()];
    let (q, k) = (zeros(&[2, 3, 1, 4]), zeros(&[2, 5, 1, 4]));
    let views = vec![
        (
            "q",
            TensorView::new(StDtype::F32, vec![2, 3, 1, 4], &q).expect("view"),
        ),
        (
            "k",
            TensorView::new(StDtype::F32, vec![2, 5, 1, 4], &k).expect("view"),
        ),
    ];
    safetensors::tensor::serialize_to_file(views.clone(), None, &input).expect("write");
    let o = opts(Family::softmax(), Layout::Bnhd, Causal::None);
    let err = check(&input, &dir.join("out.safetensors"), &o, "test").expect_err("v is missing");
    assert!(err.to_string().contains("missing tensor `v`"), "{err}");

    // k and v disagree on the sequence length: a typed shape error naming v.
    let v = zeros(&[2, 4, 1, 4]);
    let mut with_v = views;
    with_v.push((
        "v",
        TensorView::new(StDtype::F32, vec![2, 4, 1, 4], &v).expect("view"),
    ));
    safetensors::tensor::serialize_to_file(with_v, None, &input).expect("write");
    let err = check(&input, &dir.join("out.safetensors"), &o, "test").expect_err("k and v disagree");
    assert!(err.to_string().contains("`v` has the wrong shape"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_attn-bench"))
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("attn-bench starts");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "attn-bench failed:\n{text}");
    text
}

#[test]
fn cli_run_reports_unknown_family_and_writes_outputs() {
    let dir = scratch("cli-run");
    let text = run_ok(bin().args([
        "run",
        "--preset",
        "cpu-small",
        "--families",
        "softmax,no_such_family",
        "--seq-lens",
        "32,64",
        "--long-seq-lens",
        "64",
        "--passes",
        "fwd",
        "--runs",
        "3",
        "--warmup",
        "1",
        "--impls",
        "attn-cpu-ref,candle_naive,attn-cuda",
        "--bandwidth-gbs",
        "10",
        "--name",
        "tiny",
        "--out",
        dir.to_str().expect("utf-8 path"),
    ]));
    assert!(text.contains("unknown family `no_such_family`"), "{text}");
    let file = attn_bench::schema::BenchFile::read(&dir.join("tiny.json")).expect("json written");
    assert_eq!(file.rows.len(), 4, "2 N × (attn-cpu-ref, candle_naive)");
    assert_eq!(file.skipped.len(), 2, "attn-cuda is skipped with its reason");
    assert!(file.skipped.iter().all(|s| s.reason.contains("cuda")));
    let md = std::fs::read_to_string(dir.join("tiny.md")).expect("markdown written");
    assert!(md.contains("×candle_naive"), "{md}");
    assert!(is_png(&dir.join("tiny.png")));
    let _ = std::fs::remove_dir_all(dir);
}

fn is_png(p: &Path) -> bool {
    std::fs::read(p)
        .map(|b| b.starts_with(b"\x89PNG"))
        .unwrap_or(false)
}

#[test]
fn cli_check_writes_outputs_and_rejects_unknown_family() {
    let dir = scratch("cli-check");
    let spec = AttnProblem::new(Family::cosine_sim(), DType::F32, 1, 2, 2, 4, 4, 8)
        .validate()
        .expect("valid spec");
    let case = random_case(&spec, 3);
    let q = f32::bytes(&narrow::<f32>(&case.q));
    let k = f32::bytes(&narrow::<f32>(&case.k));
    let v = f32::bytes(&narrow::<f32>(&case.v));
    let views = vec![
        (
            "q",
            TensorView::new(StDtype::F32, spec.q_shape(), &q).expect("view"),
        ),
        (
            "k",
            TensorView::new(StDtype::F32, spec.k_shape(), &k).expect("view"),
        ),
        (
            "v",
            TensorView::new(StDtype::F32, spec.v_shape(), &v).expect("view"),
        ),
    ];
    let input = dir.join("in.safetensors");
    safetensors::tensor::serialize_to_file(views, None, &input).expect("write");
    let output = dir.join("out.safetensors");
    let text = run_ok(bin().args([
        "check",
        "--input",
        input.to_str().expect("utf-8"),
        "--output",
        output.to_str().expect("utf-8"),
        "--family",
        "cosine_sim",
        "--scale",
        "8",
    ]));
    assert!(text.contains("lse F32 [1, 2, 4]"), "{text}");
    let bytes = std::fs::read(&output).expect("output written");
    let st = SafeTensors::deserialize(&bytes).expect("parse");
    assert!(st.tensor("dq").is_err(), "no dO given, so no gradients");
    let out = bin()
        .args(["check", "--input", "x", "--output", "y", "--family", "flash"])
        .output()
        .expect("starts");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown family `flash`"));
    let _ = std::fs::remove_dir_all(dir);
}

/// Write `case`'s q, k, v and dO in `E` to `path`.
fn write_case<E: Le>(path: &Path, spec: &AttnSpec, case: &attn_cpu_ref::testing::Case) {
    let tensors = [
        ("q", spec.q_shape(), E::bytes(&narrow::<E>(&case.q))),
        ("k", spec.k_shape(), E::bytes(&narrow::<E>(&case.k))),
        ("v", spec.v_shape(), E::bytes(&narrow::<E>(&case.v))),
        ("do", spec.o_shape(), E::bytes(&narrow::<E>(&case.d_o))),
    ];
    let views: Vec<(&str, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, shape, data)| (*n, TensorView::new(E::ST, shape.clone(), data).expect("view")))
        .collect();
    safetensors::tensor::serialize_to_file(views, None, path).expect("write input");
}

/// Without the `cuda` feature, a GPU or the kernels: a typed `Unavailable` error before the input
/// is read, and no output. With all three (the GPU machine): attn-cuda's forward and backward in
/// f32, every tensor within f32 accumulation error of the f64 reference.
#[test]
fn check_on_cuda_runs_attn_cuda_or_says_why_not() {
    let dir = scratch("cuda");
    let (input, output) = (dir.join("in.safetensors"), dir.join("out.safetensors"));
    let mut o = opts(Family::softmax(), Layout::Bnhd, Causal::BottomRight);
    o.device = CheckDevice::Cuda;
    let spec = AttnProblem::new(o.family, DType::F32, 2, 4, 2, 40, 72, 64)
        .with_causal(o.causal)
        .validate()
        .expect("valid spec");
    match cuda_ready() {
        Err(ready) => {
            // The input does not exist: the device is checked first.
            let err = check(&input, &output, &o, "test").expect_err("no usable GPU here");
            assert!(
                matches!(
                    err,
                    BenchError::Unavailable {
                        implementation: "attn-cuda",
                        ..
                    }
                ),
                "{err}"
            );
            assert_eq!(err.to_string(), ready.to_string());
            assert!(!output.exists());
        }
        Ok(()) => {
            write_case::<f32>(&input, &spec, &random_case(&spec, 11));
            let summary = check(&input, &output, &o, "test").expect("attn-cuda runs the call");
            assert!(
                summary.description.starts_with("attn-cuda: softmax"),
                "{summary:?}"
            );
            let names: Vec<&str> = summary.comparisons.iter().map(|c| c.name).collect();
            assert_eq!(names, ["o", "lse", "dq", "dk", "dv"]);
            for c in &summary.comparisons {
                assert_eq!(c.not_finite, 0, "{c}");
                assert!(c.max_abs_diff <= 1e-4 * (1.0 + c.max_abs_reference), "{c}");
            }
            let bytes = std::fs::read(&output).expect("output written");
            let (_, meta) = SafeTensors::read_metadata(&bytes).expect("parse");
            let meta = meta.metadata().clone().expect("metadata");
            assert_eq!(meta["impl"], "attn-cuda");
            assert!(meta.contains_key("max_abs_diff_vs_f64_reference"));
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn cli_make_example_then_check_on_the_cpu() {
    let dir = scratch("cli-example");
    // Both folders are made on the way.
    let (example, output) = (dir.join("in/ex.safetensors"), dir.join("out/out.safetensors"));
    let text = run_ok(
        bin()
            .args(["check", "--make-example"])
            .arg(&example)
            .args(["--dtype", "f32", "--layout", "bhnd"]),
    );
    assert!(text.contains("q F32 [2, 4, 100, 64]"), "{text}");
    assert!(text.contains("do F32 [2, 4, 100, 64]"), "{text}");
    let text = run_ok(
        bin()
            .args(["check", "--input"])
            .arg(&example)
            .arg("--output")
            .arg(&output)
            .args([
                "--family",
                "softmax",
                "--layout",
                "bhnd",
                "--causal",
                "bottom-right",
            ]),
    );
    assert!(text.starts_with("attn-cpu-ref: softmax"), "{text}");
    assert!(
        text.contains("k F32 [2, 2, 128, 64]") || text.contains("dk F32 [2, 2, 128, 64]"),
        "{text}"
    );
    let bytes = std::fs::read(&output).expect("output written");
    let st = SafeTensors::deserialize(&bytes).expect("parse");
    assert_eq!(
        st.tensor("dq").expect("dq, since the example has do").shape(),
        [2, 4, 100, 64]
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn cli_check_on_cuda_without_a_usable_gpu_stops_with_the_reason() {
    let Err(reason) = cuda_ready() else {
        eprintln!("attn-cuda can run here: check_on_cuda_runs_attn_cuda_or_says_why_not covers it");
        return;
    };
    let out = bin()
        .args([
            "check",
            "--device",
            "cuda",
            "--input",
            "no-such-input.safetensors",
        ])
        .args(["--output", "never-written.safetensors", "--family", "softmax"])
        .output()
        .expect("starts");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&reason.to_string()), "{stderr}");
    assert!(stderr.contains("attn-cuda unavailable"), "{stderr}");
    assert!(
        !stderr.contains("no-such-input"),
        "the device is checked first: {stderr}"
    );
}

#[test]
fn cli_check_arguments_are_checked() {
    let fails_with = |args: &[&str], needle: &str| {
        let out = bin().args(args).output().expect("starts");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    };
    fails_with(&["check", "--family", "softmax"], "--input");
    fails_with(
        &["check", "--make-example", "a", "--input", "b"],
        "cannot be used with",
    );
    fails_with(
        &[
            "check", "--dtype", "f16", "--input", "a", "--output", "b", "--family", "softmax",
        ],
        "applies to --make-example only",
    );
    fails_with(
        &["check", "--make-example", "a", "--dtype", "f8"],
        "unknown dtype `f8`",
    );
    fails_with(
        &[
            "check", "--input", "a", "--output", "b", "--family", "softmax", "--device", "tpu",
        ],
        "`tpu` (expected cpu or cuda)",
    );
}

/// Without --preset and --device, `run` measures where it can (the CPU here: cpu-small with
/// attn-cpu-ref and candle_naive, no attn-cuda rows to skip), says so, and writes under
/// target/attn-bench/ of the current directory.
#[test]
fn cli_run_defaults_to_the_machine_and_writes_under_target() {
    let dir = scratch("cli-run-default");
    let text = run_ok(
        bin()
            .current_dir(&dir)
            .args([
                "run",
                "--families",
                "softmax",
                "--seq-lens",
                "32",
                "--long-seq-lens",
                "64",
            ])
            .args([
                "--passes",
                "fwd",
                "--runs",
                "2",
                "--warmup",
                "1",
                "--head-dims",
                "64",
            ])
            .args(["--bandwidth-gbs", "10", "--no-plots", "--name", "t"]),
    );
    let file =
        attn_bench::schema::BenchFile::read(&dir.join("target/attn-bench/t.json")).expect("json written");
    assert!(dir.join("target/attn-bench/t.md").exists());
    if attn_bench::impls::cuda_device().is_err() {
        assert!(text.contains("device: cpu (attn-cuda cannot run here"), "{text}");
        assert!(text.contains("preset: cpu-small"), "{text}");
        let mut impls: Vec<&str> = file.rows.iter().map(|r| r.implementation.as_str()).collect();
        impls.sort();
        assert_eq!(
            impls,
            ["attn-cpu-ref", "attn-cpu-ref", "candle_naive", "candle_naive"]
        );
        assert!(file.skipped.is_empty(), "{:?}", file.skipped);
    } else {
        assert!(
            text.contains("device: cuda") && text.contains("preset: flash"),
            "{text}"
        );
        assert!(file.rows.iter().all(|r| r.implementation == "attn-cuda"));
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn cli_run_device_is_checked() {
    let out = bin().args(["run", "--device", "tpu"]).output().expect("starts");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("`tpu` (expected cpu or cuda)"));
    if let Err(reason) = attn_bench::impls::cuda_device() {
        let out = bin().args(["run", "--device", "cuda"]).output().expect("starts");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            stderr.contains(&format!("attn-cuda unavailable: {reason}")),
            "{stderr}"
        );
    }
}
