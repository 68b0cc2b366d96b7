//! `check` reproduces attn-cpu-ref bit for bit through a safetensors round trip, and the command
//! line handles both subcommands end to end.

use attn_bench::check::{check, CheckDevice, CheckOptions};
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
        "--out-dir",
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
