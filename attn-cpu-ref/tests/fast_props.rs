//! The fast path against the f64 oracle on random small problems covering every option of the
//! spec: every softmax-like family with random parameters, both layouts, causal alignments,
//! windows, key padding, varlen, GQA, bias with broadcast, f32, f16 and bf16 storage.

mod common;
mod fast_common;

use attn_core::DType;
use common::{problem, run_cases, softmax_like_family};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

fn dtype() -> impl Strategy<Value = DType> + Clone {
    prop_oneof![Just(DType::F32), Just(DType::F16), Just(DType::BF16)]
}

#[test]
fn fast_forward_and_backward_match_the_oracle_on_every_spec_option() {
    let strategy = (problem(softmax_like_family()), dtype(), any::<u64>());
    run_cases(
        "fast_forward_and_backward_match_the_oracle_on_every_spec_option",
        256,
        strategy,
        |(mut p, dtype, seed)| {
            p.dtype = dtype;
            let spec = p.validate().map_err(|e| TestCaseError::fail(e.to_string()))?;
            fast_common::check(&spec, seed).map_err(TestCaseError::fail)
        },
    );
}
