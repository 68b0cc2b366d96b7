//! Recurrent decode on the GPU: token by token against `attn_cpu_ref::decode`, and states built by
//! another backend.

use super::*;

/// Recurrent decode on the GPU: a prefilled causal prompt continued one token at a time, then two at a
/// time, against the CPU decode reference (f64) on the same rounded inputs.
fn decode_case<T: DeviceElem>(order: u8, d: usize) -> Result<(), String> {
    let dt = T::DTYPE;
    let (b, hq, hk, p) = (2, 4, 2, 70);
    let fam = taylor_family(order);
    let mk = |n: usize| {
        AttnProblem::new(fam, dt, b, hq, hk, n, n, d)
            .with_causal(Causal::TopLeft)
            .validate()
            .expect("valid")
    };
    let g = gpu();
    let s = g.stream();
    let up = |x: &[f64]| {
        s.clone_htod(&x.iter().map(|&v| T::from_f64(v)).collect::<Vec<T>>())
            .expect("upload")
    };
    let prompt = mk(p);
    let mut pc = random_case(&prompt, 31);
    round_all::<T>(&mut pc, 1.0);
    let (_, mut cpu) = prefill_f64(&prompt, pc.inputs()).map_err(|e| e.to_string())?;
    let (q, k, v) = (up(&pc.q), up(&pc.k), up(&pc.v));
    let mut o = s.alloc_zeros::<T>(prompt.o_len()).expect("alloc");
    let mut den = s.alloc_zeros::<f32>(prompt.stats_len()).expect("alloc");
    let views = ForwardViews {
        q: q.slice(..),
        k: k.slice(..),
        v: v.slice(..),
        bias: None,
        o: o.slice_mut(..),
        lse: den.slice_mut(..),
    };
    let mut state = g.taylor_prefill(&prompt, views).map_err(|e| e.to_string())?;
    let u = dt.unit_roundoff();
    for (step, t) in [1, 1, 1, 2, 2, 1].into_iter().enumerate() {
        let spec = mk(t);
        let mut c = random_case(&spec, 40 + step as u64);
        round_all::<T>(&mut c, 1.0);
        let want = step_f64(&mut cpu, &spec, c.inputs()).map_err(|e| e.to_string())?;
        let (q, k, v) = (up(&c.q), up(&c.k), up(&c.v));
        let mut o = s
            .clone_htod(&vec![T::from_f64(f64::NAN); spec.o_len()])
            .expect("upload");
        let mut den = s.clone_htod(&vec![f32::NAN; spec.stats_len()]).expect("upload");
        let views = ForwardViews {
            q: q.slice(..),
            k: k.slice(..),
            v: v.slice(..),
            bias: None,
            o: o.slice_mut(..),
            lse: den.slice_mut(..),
        };
        g.taylor_decode_step(&mut state, &spec, views)
            .map_err(|e| e.to_string())?;
        let got_o: Vec<f64> = s
            .clone_dtoh(&o)
            .expect("download")
            .iter()
            .map(|x| x.to_f64())
            .collect();
        let got_den: Vec<f64> = s
            .clone_dtoh(&den)
            .expect("download")
            .iter()
            .map(|&x| x as f64)
            .collect();
        let (eo, ed) = (
            attn_cpu_ref::testing::max_abs_diff(&got_o, &want.o),
            attn_cpu_ref::testing::max_abs_diff(&got_den, &want.stats),
        );
        let (to, td) = (
            (2.0 * u + 1e-5) * max_abs(&want.o).max(1e-3),
            1e-5 * max_abs(&want.stats).max(1.0),
        );
        if !(eo <= to && ed <= td) || got_o.iter().any(|x| !x.is_finite()) {
            return Err(format!(
                "order {order} D={d} {dt} step {step}: o error {eo:.3e} (tol {to:.3e}), den error {ed:.3e} (tol {td:.3e})"
            ));
        }
    }
    for bi in 0..b {
        if state.len(bi) != p + 8 {
            return Err(format!("state length {} after {} tokens", state.len(bi), p + 8));
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn taylor_decode_token_by_token_matches_the_cpu_decode() {
    common::each_config(&common::taylor_configs(), || {
        let mut cases = Cases::new("taylor_decode_token_by_token_matches_the_cpu_decode");
        for order in [1, 2] {
            for d in DIMS {
                for dtype in DType::ALL {
                    if !case_selected(d, dtype) {
                        cases.skip();
                        continue;
                    }
                    let r = match dtype {
                        DType::F32 => decode_case::<f32>(order, d),
                        DType::F16 => decode_case::<f16>(order, d),
                        DType::BF16 => decode_case::<bf16>(order, d),
                    };
                    cases.record(format_args!("order {order} D={d} {dtype}"), r);
                }
            }
        }
        cases.finish();
    });
}

/// A decode state built by another `CudaAttn` (its own stream of the same context) steps on this one:
/// the device check accepts it and the result equals stepping with the backend that built it. A state
/// built on another device (another context) is an `InvalidArgument` naming `state` (checked where the
/// machine has a second GPU; one context per device is all cudarc opens, so on one GPU the foreign case
/// cannot be built).
#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn taylor_decode_state_from_another_backend_or_device() {
    use attn_cuda::cudarc::driver::CudaContext;
    use attn_cuda::CudaAttn;
    let a = gpu();
    let b = CudaAttn::with_stream(a.stream().context().new_stream().expect("a second stream"));
    let prompt = AttnProblem::new(Family::taylor(2), DType::BF16, 1, 2, 1, 32, 32, 32)
        .with_causal(Causal::TopLeft)
        .validate()
        .expect("valid");
    let step = AttnProblem::new(Family::taylor(2), DType::BF16, 1, 2, 1, 1, 1, 32)
        .with_causal(Causal::TopLeft)
        .validate()
        .expect("valid");
    let run = |build: &CudaAttn, stepper: &CudaAttn| -> Result<Vec<f32>, CudaAttnError> {
        let (s, t) = (build.stream(), stepper.stream());
        let up = |s: &std::sync::Arc<attn_cuda::cudarc::driver::CudaStream>, n: usize, seed| {
            s.clone_htod(&common::bench::random_bf16(n, seed))
                .expect("upload")
        };
        let (q, k, v) = (
            up(s, prompt.q_len(), 1),
            up(s, prompt.k_len(), 2),
            up(s, prompt.v_len(), 3),
        );
        let mut o = s.alloc_zeros::<bf16>(prompt.o_len()).expect("alloc");
        let mut den = s.alloc_zeros::<f32>(prompt.stats_len()).expect("alloc");
        let mut state = build.taylor_prefill(
            &prompt,
            ForwardViews {
                q: q.slice(..),
                k: k.slice(..),
                v: v.slice(..),
                bias: None,
                o: o.slice_mut(..),
                lse: den.slice_mut(..),
            },
        )?;
        let (q, k, v) = (
            up(t, step.q_len(), 4),
            up(t, step.k_len(), 5),
            up(t, step.v_len(), 6),
        );
        let mut o = t.alloc_zeros::<bf16>(step.o_len()).expect("alloc");
        let mut den = t.alloc_zeros::<f32>(step.stats_len()).expect("alloc");
        stepper.taylor_decode_step(
            &mut state,
            &step,
            ForwardViews {
                q: q.slice(..),
                k: k.slice(..),
                v: v.slice(..),
                bias: None,
                o: o.slice_mut(..),
                lse: den.slice_mut(..),
            },
        )?;
        let o: Vec<bf16> = t.clone_dtoh(&o).expect("download");
        let mut out: Vec<f32> = o.iter().map(|x| x.to_f32()).collect();
        out.extend(t.clone_dtoh(&den).expect("download"));
        Ok(out)
    };
    let same = run(a, a).expect("built and stepped on one backend");
    let other = run(a, &b).expect("a state of another stream of the same context");
    assert!(
        same.iter().zip(&other).all(|(x, y)| x.to_bits() == y.to_bits()),
        "stepping on another stream of the context changed the result"
    );
    let devices = CudaContext::device_count().unwrap_or(1);
    if devices < 2 {
        println!("one GPU: the state-from-another-device case needs a second device (skipped)");
        return;
    }
    let d1 = CudaAttn::new(1).expect("device 1");
    match run(&d1, a) {
        Err(CudaAttnError::Attn(AttnError::InvalidArgument {
            arg: "state", reason, ..
        })) => {
            assert!(reason.contains("device 1"), "{reason}")
        }
        other => panic!("a state of device 1 stepped on device 0: expected an error, got {other:?}"),
    }
}
