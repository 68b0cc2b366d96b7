//! Compute every attention family on random data and check each gradient against central finite
//! differences of `L = Σ o ⊙ dO`, printing a table.
//!
//! ```text
//! cargo run --release -p attn-cpu-ref --example gradcheck
//! ```

use attn_core::{Aggregation, AttnProblem, Causal, DType, Family, HypScore, TaylorParams};
use attn_cpu_ref::testing::{check_gradients, max_abs, random_case};
use attn_cpu_ref::{backward_f64, forward_f64};
use std::process::ExitCode;
use std::time::Instant;

fn families() -> Vec<(&'static str, Family)> {
    vec![
        ("softmax", Family::softmax()),
        ("cosine_sim", Family::cosine_sim()),
        (
            "taylor1 (l2-normalised)",
            Family::Taylor(TaylorParams {
                order: 1,
                qk_l2norm: true,
                scale: Some(0.5),
                ..TaylorParams::default()
            }),
        ),
        ("taylor2", Family::taylor(2)),
        (
            "hyperbolic geodesic",
            Family::hyperbolic(HypScore::Geodesic, Aggregation::Euclidean),
        ),
        (
            "hyperbolic sq-lorentz + Einstein",
            Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::EinsteinMidpoint),
        ),
    ]
}

fn main() -> ExitCode {
    // B=2, Hq=4 over Hkv=2 (GQA), Nq=7 < Nk=11 (cross-attention, tails), D=8, Dv=6, bottom-right causal.
    println!("grouped-query cross-attention: B=2, Hq=4, Hkv=2, Nq=7, Nk=11, D=8, Dv=6, causal bottom-right");
    println!("gradients of L = Σ o·dO (random dO) vs central finite differences (h = 1e-5), f64\n");
    println!(
        "{:<34} {:>10} {:>10} {:>10} {:>12} {:>8}",
        "family", "max|o|", "max|dq|", "max|dk|", "fd check", "ms"
    );
    let mut failures = 0;
    for (name, family) in families() {
        let t = Instant::now();
        let result = AttnProblem::new(family, DType::F32, 2, 4, 2, 7, 11, 8)
            .with_head_dim_v(6)
            .with_causal(Causal::BottomRight)
            .validate()
            .map_err(|e| e.to_string())
            .and_then(|spec| {
                let case = random_case(&spec, 7);
                let f = forward_f64(&spec, case.inputs()).map_err(|e| e.to_string())?;
                let g = backward_f64(&spec, case.inputs(), &f.o, &case.d_o, &f.stats)
                    .map_err(|e| e.to_string())?;
                let check = check_gradients(&case, 1e-5, 1e-6, 1e-8);
                Ok((max_abs(&f.o), max_abs(&g.dq), max_abs(&g.dk), check))
            });
        let ms = t.elapsed().as_secs_f64() * 1e3;
        match result {
            Ok((o, dq, dk, check)) => {
                let verdict = match &check {
                    Ok(()) => "pass".to_string(),
                    Err(_) => "FAIL".to_string(),
                };
                println!("{name:<34} {o:>10.4} {dq:>10.4} {dk:>10.4} {verdict:>12} {ms:>8.1}");
                if let Err(e) = check {
                    println!("    {e}");
                    failures += 1;
                }
            }
            Err(e) => {
                println!("{name:<34} error: {e}");
                failures += 1;
            }
        }
    }
    if failures == 0 {
        println!("\nall gradients match finite differences");
        ExitCode::SUCCESS
    } else {
        println!("\n{failures} families failed");
        ExitCode::FAILURE
    }
}
