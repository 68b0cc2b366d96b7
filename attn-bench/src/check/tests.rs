//! `check`'s tests: parsing, the CPU and device runs against the reference, malformed inputs.

use super::*;
use safetensors::tensor::TensorView;
use safetensors::SafeTensors;

fn case_inputs<E: Stored>(spec: &AttnSpec) -> HostInputs<E> {
    let case = random_case(spec, 5);
    let narrow = |x: &[f64]| x.iter().map(|&v| E::from_f64(v)).collect::<Vec<E>>();
    HostInputs {
        q: narrow(&case.q),
        k: narrow(&case.k),
        v: narrow(&case.v),
        bias: case.bias.as_deref().map(narrow),
        d_o: Some(narrow(&case.d_o)),
    }
}

/// attn-cpu-ref's own outputs, put where a device's go: o and the statistics differ from the
/// f64 reference by exactly their rounding; the gradients (computed from the rounded o and
/// statistics) by about as much.
#[test]
fn reference_comparisons_of_the_rounded_reference_are_its_rounding() {
    let spec = AttnProblem::new(Family::softmax(), DType::BF16, 1, 2, 1, 6, 9, 8)
        .with_causal(Causal::BottomRight)
        .with_bias(1, 2)
        .validate()
        .expect("valid spec");
    let x = case_inputs::<bf16>(&spec);
    let f = forward(&spec, x.inputs()).expect("forward");
    let d_o = x.d_o.as_deref().expect("do");
    let g = backward(&spec, x.inputs(), &f.o, d_o, &f.stats).expect("backward");
    let c = reference_comparisons(&spec, &x, &f, Some(&g)).expect("compares");
    let names: Vec<&str> = c.iter().map(|c| c.name).collect();
    assert_eq!(names, ["o", "lse", "dq", "dk", "dv", "dbias"]);
    for c in &c {
        assert_eq!(c.not_finite, 0, "{c}");
        assert!(c.rounding > 0.0, "{c}");
        assert!(
            c.max_abs_diff <= 2.0 * c.rounding + 1e-6 * c.max_abs_reference,
            "{c}"
        );
    }
    assert_eq!(c[0].max_abs_diff, c[0].rounding);
    assert_eq!(c[1].max_abs_diff, c[1].rounding);
    assert_eq!((c[0].dtype, c[1].dtype), ("bf16", "f32"));
}

#[test]
fn an_unwritten_output_element_is_a_non_finite_mismatch() {
    let spec = AttnProblem::new(Family::taylor(1), DType::F32, 1, 1, 1, 4, 4, 8)
        .validate()
        .expect("valid spec");
    let mut x = case_inputs::<f32>(&spec);
    x.d_o = None;
    let mut f = forward(&spec, x.inputs()).expect("forward");
    f.o[3] = f32::NAN;
    let c = reference_comparisons(&spec, &x, &f, None).expect("compares");
    assert_eq!(c.len(), 2, "no do: o and den only");
    assert_eq!((c[0].name, c[0].not_finite), ("o", 1));
    assert_eq!(c[0].max_abs_diff, f64::INFINITY);
    assert_eq!((c[1].name, c[1].not_finite), ("den", 0));
}

/// A safetensors file of `tensors` (name, dtype, shape, bytes).
fn file(tensors: &[(&str, StDtype, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let views: Vec<(&str, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                *n,
                TensorView::new(*d, s.clone(), b).expect("a consistent tensor"),
            )
        })
        .collect();
    safetensors::tensor::serialize(views, None).expect("serialize")
}

fn f32s(shape: &[usize]) -> (StDtype, Vec<usize>, Vec<u8>) {
    let n: usize = shape.iter().product();
    (StDtype::F32, shape.to_vec(), vec![0; 4 * n])
}

fn i64s(values: &[i64]) -> (StDtype, Vec<usize>, Vec<u8>) {
    (
        StDtype::I64,
        vec![values.len()],
        values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    )
}

fn qkv(q: &[usize], k: &[usize], v: &[usize]) -> Vec<(&'static str, StDtype, Vec<usize>, Vec<u8>)> {
    let t = |n, (d, s, b)| (n, d, s, b);
    vec![t("q", f32s(q)), t("k", f32s(k)), t("v", f32s(v))]
}

fn opts() -> CheckOptions {
    CheckOptions {
        family: Family::softmax(),
        layout: Layout::Bnhd,
        causal: Causal::None,
        window: None,
        device: CheckDevice::Cpu,
        reference: false,
    }
}

/// The error's message; a panic if `r` is not an error.
fn message(r: Result<ParsedCall, BenchError>) -> String {
    match r {
        Ok(p) => panic!("expected an error, parsed {:?}", p.spec.q_shape()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_well_formed_file_parses_to_its_call() {
    let mut t = qkv(&[2, 5, 4, 8], &[2, 7, 2, 8], &[2, 7, 2, 8]);
    let (d, s, b) = f32s(&[2, 5, 4, 8]);
    t.push(("do", d, s, b));
    let p = parse(&file(&t), &opts()).expect("a valid call");
    assert_eq!(p.spec.q_shape(), vec![2, 5, 4, 8]);
    assert_eq!((p.spec.heads_kv(), p.spec.seq_k()), (2, 7));
    assert!(p.backward);
    let (summary, out) = check_bytes(&file(&t), Path::new("out.safetensors"), &opts(), "test").expect("runs");
    assert!(
        summary.tensors.iter().any(|l| l.starts_with("dq ")),
        "{:?}",
        summary.tensors
    );
    let st = SafeTensors::deserialize(&out).expect("the output is a safetensors file");
    assert_eq!(st.tensor("o").expect("o").shape(), &[2, 5, 4, 8]);
}

#[test]
fn bytes_that_are_not_safetensors_are_errors() {
    for bytes in [
        Vec::new(),
        vec![1, 2, 3],
        // A header length past the end of the file.
        (1u64 << 60).to_le_bytes().to_vec(),
        // A header that is not JSON.
        [8u64.to_le_bytes().to_vec(), b"not json".to_vec()].concat(),
        // A tensor whose offsets run past the data.
        {
            let h = br#"{"q":{"dtype":"F32","shape":[1,1,1,4],"data_offsets":[0,16]}}"#;
            [(h.len() as u64).to_le_bytes().to_vec(), h.to_vec(), vec![0; 8]].concat()
        },
        // Offsets that disagree with the shape.
        {
            let h = br#"{"q":{"dtype":"F32","shape":[1,1,1,4],"data_offsets":[0,8]}}"#;
            [(h.len() as u64).to_le_bytes().to_vec(), h.to_vec(), vec![0; 8]].concat()
        },
    ] {
        let msg = message(parse(&bytes, &opts()));
        assert!(msg.starts_with("safetensors <input>"), "{msg}");
    }
}

#[test]
fn a_file_over_the_size_limit_is_an_error_before_parsing() {
    let bytes = file(&qkv(&[1, 4, 1, 8], &[1, 4, 1, 8], &[1, 4, 1, 8]));
    let err = reader(Path::new("<input>"), &bytes, 64)
        .map(drop)
        .expect_err("over the limit");
    assert!(err.to_string().contains("limit"), "{err}");
    assert!(reader(Path::new("<input>"), &bytes, bytes.len() as u64).is_ok());
}

#[test]
fn missing_or_mistyped_tensors_name_the_tensor() {
    let t = qkv(&[1, 4, 1, 8], &[1, 4, 1, 8], &[1, 4, 1, 8]);
    let msg = message(parse(&file(&t[..2]), &opts()));
    assert!(msg.contains("missing tensor `v`"), "{msg}");
    let mut ints = t.clone();
    ints[0] = ("q", StDtype::I32, vec![1, 4, 1, 8], vec![0; 4 * 32]);
    assert!(message(parse(&file(&ints), &opts())).contains("q is I32"));
    let mut half = t.clone();
    half[1] = ("k", StDtype::F16, vec![1, 4, 1, 8], vec![0; 2 * 32]);
    assert!(message(parse(&file(&half), &opts())).contains("`k` is F16"));
    let mut d_o = t.clone();
    d_o.push(("do", StDtype::BF16, vec![1, 4, 1, 8], vec![0; 2 * 32]));
    assert!(message(parse(&file(&d_o), &opts())).contains("`do` is BF16"));
}

#[test]
fn wrong_ranks_and_shapes_are_shape_errors() {
    for (q, k, v, what) in [
        (vec![4, 1, 8], vec![1, 4, 1, 8], vec![1, 4, 1, 8], "q"),
        (vec![1, 4, 1, 8], vec![2, 4, 1, 8], vec![2, 4, 1, 8], "k"),
        (vec![1, 4, 3, 8], vec![1, 4, 2, 8], vec![1, 4, 2, 8], "k"),
        (vec![1, 4, 1, 8], vec![1, 4, 1, 8], vec![1, 5, 1, 8], "v"),
        (vec![1, 4, 0, 8], vec![1, 4, 1, 8], vec![1, 4, 1, 8], "heads_q"),
    ] {
        let msg = message(parse(&file(&qkv(&q, &k, &v)), &opts()));
        assert!(msg.contains(what), "{q:?} {k:?} {v:?}: {msg}");
    }
    // An empty sequence is a valid (empty) call, as in candle and PyTorch.
    let p = parse(&file(&qkv(&[1, 0, 1, 8], &[1, 4, 1, 8], &[1, 4, 1, 8])), &opts());
    assert_eq!(p.expect("an empty query sequence parses").spec.o_len(), 0);
    let mut t = qkv(&[1, 4, 1, 8], &[1, 4, 1, 8], &[1, 4, 1, 8]);
    let (d, s, b) = f32s(&[1, 4, 1, 9]);
    t.push(("do", d, s, b));
    assert!(message(parse(&file(&t), &opts())).contains("do"));
}

#[test]
fn bad_lengths_are_errors_never_panics() {
    let packed = |cu_q: &[i64], cu_k: &[i64]| {
        let mut t = qkv(&[6, 2, 8], &[6, 2, 8], &[6, 2, 8]);
        let (d, s, b) = i64s(cu_q);
        t.push(("cu_seqlens_q", d, s, b));
        let (d, s, b) = i64s(cu_k);
        t.push(("cu_seqlens_k", d, s, b));
        file(&t)
    };
    assert!(parse(&packed(&[0, 2, 6], &[0, 3, 6]), &opts()).is_ok());
    for (cu_q, cu_k) in [
        (vec![0, -1, 6], vec![0, 3, 6]),
        (vec![0, 1 << 62], vec![0, 6]),
        (vec![0, 4, 2], vec![0, 3, 6]),
        (vec![0, 2, 7], vec![0, 3, 6]),
        (vec![1, 6], vec![0, 6]),
        (vec![0], vec![0]),
        (vec![0, i64::MAX, 6], vec![0, 3, 6]),
    ] {
        let r = parse(&packed(&cu_q, &cu_k), &opts());
        assert!(r.is_err(), "cu_seqlens_q {cu_q:?} cu_seqlens_k {cu_k:?} parsed");
    }
    // Only one of the two offsets.
    let mut t = qkv(&[6, 2, 8], &[6, 2, 8], &[6, 2, 8]);
    let (d, s, b) = i64s(&[0, 6]);
    t.push(("cu_seqlens_q", d, s, b));
    assert!(message(parse(&file(&t), &opts())).contains("or neither"));
    // Key lengths: 2-d, too long, and a float tensor.
    let dense = || qkv(&[2, 4, 1, 8], &[2, 4, 1, 8], &[2, 4, 1, 8]);
    for lens in [
        (
            StDtype::I64,
            vec![1, 2],
            [2i64, 3].iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
        (
            StDtype::I64,
            vec![2],
            [2i64, 9].iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
        (StDtype::F32, vec![2], vec![0u8; 8]),
        (
            StDtype::I64,
            vec![3],
            [1i64, 1, 1].iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
    ] {
        let mut t = dense();
        t.push(("key_lens", lens.0, lens.1.clone(), lens.2.clone()));
        assert!(
            parse(&file(&t), &opts()).is_err(),
            "key_lens {:?} {:?} parsed",
            lens.0,
            lens.1
        );
    }
}

#[test]
fn a_bias_of_the_wrong_rank_or_family_is_an_error() {
    let mut t = qkv(&[1, 4, 2, 8], &[1, 5, 2, 8], &[1, 5, 2, 8]);
    let (d, s, b) = f32s(&[2, 4, 5]);
    t.push(("bias", d, s, b));
    assert!(message(parse(&file(&t), &opts())).contains("bias"));
    let mut t = qkv(&[1, 4, 2, 8], &[1, 5, 2, 8], &[1, 5, 2, 8]);
    let (d, s, b) = f32s(&[1, 2, 4, 5]);
    t.push(("bias", d, s, b));
    assert!(parse(&file(&t), &opts()).is_ok());
    let taylor = CheckOptions {
        family: Family::taylor(2),
        ..opts()
    };
    assert!(parse(&file(&t), &taylor).is_err());
}
