//! Windows wider than both sequences on the CPU reference: validation clamps them to `Nq + Nk` (what
//! the kernels see), so a window of 2^63 or `usize::MAX` gives exactly the unwindowed result.

use attn_core::{AttnProblem, Causal, DType, Family};
use attn_cpu_ref::testing::{random_case, Case};
use attn_cpu_ref::{backward_f64, forward_f64, Forward, Gradients};

fn run(p: &AttnProblem, seed: u64) -> (Forward<f64, f64>, Gradients<f64>) {
    let spec = p.validate().expect("valid problem");
    let case: Case = random_case(&spec, seed);
    let f = forward_f64(&spec, case.inputs()).expect("buffers match the spec");
    let g = backward_f64(&spec, case.inputs(), &f.o, &case.d_o, &f.stats).expect("buffers match the spec");
    (f, g)
}

#[test]
fn windows_wider_than_both_sequences_equal_no_window_bit_for_bit() {
    let (nq, nk) = (7, 11);
    for family in [Family::softmax(), Family::cosine_sim()] {
        for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
            let open = AttnProblem::new(family, DType::F32, 2, 4, 2, nq, nk, 8).with_causal(causal);
            let want = run(&open, 3);
            for (left, right) in [
                (Some(usize::MAX), Some(1 << 63)),
                (Some(1 << 63), None),
                (None, Some(usize::MAX)),
                (Some(nq + nk), Some(nq + nk)),
            ] {
                let got = run(&open.clone().with_window(left, right), 3);
                assert_eq!(got, want, "{family:?} {causal:?}, window ({left:?}, {right:?})");
            }
        }
    }
}
