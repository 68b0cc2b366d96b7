//! The chain kernels' bounded wait and the NaN/Inf contract (docs/nan.md) on the GPU.

use super::*;

/// One poisoned spot of the NaN/Inf contract: tensor, row (b, n, head) and column, and the value.
#[derive(Clone, Copy, Debug)]
enum Poisoned {
    Q,
    K,
    V,
    DO,
}

/// The single-pass causal order-1 forward's waits are bounded (docs/kernels/taylor-order1.md): with the
/// test hook keeping round 0's flags down, a call under `ATTN_CUDA_CHECK_LAUNCHES=1` returns
/// `CudaAttnError::Stalled` naming the chain kernel after the bound instead of hanging, and the context
/// stays usable (the next call, without the hook, succeeds with finite outputs). The variable is read
/// once per process, so the test runs itself again as a child process with it set.
#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn taylor_chain_wait_is_bounded_and_reported() {
    // The test's path in this binary (`--exact` matches the whole path).
    const NAME: &str = "robustness::taylor_chain_wait_is_bounded_and_reported";
    const CHILD: &str = "ATTN_TEST_CHAIN_CHILD";
    if std::env::var_os(CHILD).is_none() {
        let exe = std::env::current_exe().expect("the test binary's path");
        let out = std::process::Command::new(exe)
            .args([NAME, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .env("ATTN_CUDA_CHECK_LAUNCHES", "1")
            .output()
            .expect("run the test binary as a child");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "the child process failed:\n{text}");
        assert!(
            text.matches("stalled as expected").count() == 3,
            "the child did not run the three stalled calls:\n{text}"
        );
        return;
    }
    use attn_cuda::{CudaAttn, KernelConfig};
    let base = gpu();
    // 128-key segments: four rounds, so forward and fold blocks wait on earlier rounds. The portable
    // configuration runs the mma.sync chain kernel for bf16 too; the default one the wgmma kernel.
    let configs = [
        ("default", KernelConfig::default()),
        ("portable", KernelConfig::portable()),
    ];
    for (cfg_name, config) in configs {
        let g = CudaAttn::with_config(
            base.stream().clone(),
            KernelConfig {
                taylor_causal_segment: Some(128),
                ..config
            },
        )
        .expect("configuration");
        for dtype in [DType::BF16, DType::F16] {
            if cfg_name == "portable" && dtype == DType::F16 {
                continue; // the same mma.sync kernel as the default configuration's f16
            }
            let spec = AttnProblem::new(taylor_family(1), dtype, 1, 2, 2, 512, 512, 64)
                .with_causal(Causal::TopLeft)
                .validate()
                .expect("valid");
            let s = g.stream();
            let n = |len: usize| len.max(1);
            let up = |len: usize| {
                s.clone_htod(&vec![half::bf16::from_f32(0.25); n(len)])
                    .expect("upload")
            };
            let (q, k, v) = (up(spec.q_len()), up(spec.k_len()), up(spec.v_len()));
            let mut o = up(spec.o_len());
            let mut den = s.alloc_zeros::<f32>(n(spec.stats_len())).expect("alloc");
            let mut call = || {
                // The buffers hold bf16 bits; for f16 the values differ but stay finite, which is all
                // this test reads.
                match dtype {
                    DType::F16 => {
                        let cast = |x: &attn_cuda::cudarc::driver::CudaSlice<half::bf16>| {
                            let h: Vec<half::bf16> = s.clone_dtoh(x).expect("download");
                            let f: Vec<f16> = h.iter().map(|x| f16::from_f32(x.to_f32())).collect();
                            s.clone_htod(&f).expect("upload")
                        };
                        let (qh, kh, vh) = (cast(&q), cast(&k), cast(&v));
                        let mut oh = cast(&o);
                        let r = g.forward_views(
                            &spec,
                            ForwardViews {
                                q: qh.slice(..),
                                k: kh.slice(..),
                                v: vh.slice(..),
                                bias: None,
                                o: oh.slice_mut(..),
                                lse: den.slice_mut(..),
                            },
                        );
                        let out: Vec<f16> = s.clone_dtoh(&oh).expect("download");
                        r.map(|()| out.iter().all(|x| x.is_finite()))
                    }
                    _ => {
                        let r = g.forward_views(
                            &spec,
                            ForwardViews {
                                q: q.slice(..),
                                k: k.slice(..),
                                v: v.slice(..),
                                bias: None,
                                o: o.slice_mut(..),
                                lse: den.slice_mut(..),
                            },
                        );
                        let out: Vec<half::bf16> = s.clone_dtoh(&o).expect("download");
                        r.map(|()| out.iter().all(|x| x.is_finite()))
                    }
                }
            };
            attn_cuda::chain_stall_for_tests(true);
            let t0 = std::time::Instant::now();
            let stalled = call();
            attn_cuda::chain_stall_for_tests(false);
            match stalled {
                Err(CudaAttnError::Stalled {
                    kernel, waited_ms, ..
                }) => {
                    assert!(kernel.contains("order1_chain"), "{cfg_name} {dtype}: {kernel}");
                    assert!(waited_ms >= 1000, "{cfg_name} {dtype}: {waited_ms} ms");
                    println!(
                        "{cfg_name} {dtype}: {kernel} stalled as expected after {:.2} s",
                        t0.elapsed().as_secs_f64()
                    );
                }
                other => panic!("{cfg_name} {dtype}: expected Stalled, got {other:?}"),
            }
            match call() {
                Ok(true) => {}
                other => panic!("{cfg_name} {dtype}: the call after the stall gave {other:?}"),
            }
        }
    }
}

/// The poisoned case: element `c` of row (b, n, h) of `t` set to `bad`.
fn poison(
    spec: &AttnSpec,
    case: &Case,
    t: Poisoned,
    (b, n, h): (usize, usize, usize),
    c: usize,
    bad: f64,
) -> Case {
    let mut x = case.clone();
    match t {
        Poisoned::Q => x.q[spec.q_offset(b, n, h) + c] = bad,
        Poisoned::K => x.k[spec.k_offset(b, n, h) + c] = bad,
        Poisoned::V => x.v[spec.v_offset(b, n, h) + c] = bad,
        Poisoned::DO => x.d_o[spec.o_offset(b, n, h) + c] = bad,
    }
    x
}

/// The tile of the kernels' masked products (docs/nan.md, "masked pairs inside a tile"): under a
/// mask, a NaN may reach rows and keys the mask hides from it only within this many positions of
/// the poisoned row, in the same batch entry.
const MASKED_TILE: usize = 128;

/// (batch entry, position) of every element of a tensor whose element `offset(b, n, h)` starts
/// row n of head h (`heads` heads, `dim` columns); `len(b)` rows in entry b.
fn positions(
    spec: &AttnSpec,
    n_elems: usize,
    heads: usize,
    dim: usize,
    len: impl Fn(usize) -> usize,
    offset: impl Fn(usize, usize, usize) -> usize,
) -> Vec<Option<(usize, usize)>> {
    let mut at = vec![None; n_elems];
    for b in 0..spec.batch() {
        for n in 0..len(b) {
            for h in 0..heads {
                let o = offset(b, n, h);
                for c in 0..dim {
                    if let Some(x) = at.get_mut(o + c) {
                        *x = Some((b, n));
                    }
                }
            }
        }
    }
    at
}

/// docs/nan.md on the GPU against the reference, elementwise: an element the reference makes NaN is NaN
/// on the GPU (never laundered); every other element is bit-for-bit the GPU's result without the
/// poison, except, under a mask, elements of the poisoned row's tile that the mask hides from it: those
/// may be NaN (the documented gap of the tensor-core products: `0·NaN` for a masked pair), never
/// another finite value.
fn nan_contract<T: DeviceElem>(spec: &AttnSpec, seed: u64) -> Result<(), String> {
    let mut case = random_case(spec, seed);
    round_all::<T>(&mut case, 1.0);
    let clean = run_gpu::<T>(spec, &case, 0)?;
    let (b, n, hq, hk) = (1, spec.seq_lens(1).q / 2, 1, 1);
    // ±∞ in q or k: only f32, as for the flash kernels' tests (gpu_softmax_like); the Taylor kernels
    // take an infinite entry as IEEE arithmetic does (docs/nan.md, "On the GPU"), on every dtype.
    let mut spots = vec![
        (Poisoned::Q, (b, n, hq), f64::NAN),
        (Poisoned::K, (b, n, hk), f64::NAN),
        (Poisoned::V, (b, n, hk), f64::NAN),
        (Poisoned::DO, (b, n, hq), f64::NAN),
        // The first key of entry 0: every row of its heads' group sees it under a causal mask.
        (Poisoned::K, (0, 0, 0), f64::NAN),
    ];
    if spec.seq_lens(1).k > n + 1 {
        spots.push((Poisoned::K, (b, spec.seq_lens(1).k - 1, hk), f64::NAN)); // the last key
    }
    let masked = spec.causal() != Causal::None;
    let (d, dv) = (spec.head_dim(), spec.head_dim_v());
    let (hq_n, hk_n) = (spec.heads_q(), spec.heads_kv());
    let q_len = |b: usize| spec.seq_lens(b).q;
    let k_len = |b: usize| spec.seq_lens(b).k;
    let rows_o = positions(spec, spec.o_len(), hq_n, dv, q_len, |b, i, h| {
        spec.o_offset(b, i, h)
    });
    let rows_dq = positions(spec, spec.dq_len(), hq_n, d, q_len, |b, i, h| {
        spec.dq_offset(b, i, h)
    });
    let rows_stat = positions(spec, spec.stats_len(), hq_n, 1, q_len, |b, i, h| {
        spec.stats_index(b, h, i)
    });
    let keys_dk = positions(spec, spec.dk_len(), hk_n, d, k_len, |b, j, h| {
        spec.dk_offset(b, j, h)
    });
    let keys_dv = positions(spec, spec.dv_len(), hk_n, dv, k_len, |b, j, h| {
        spec.dv_offset(b, j, h)
    });
    for (t, at, bad) in spots {
        let x = poison(spec, &case, t, at, 3, bad);
        let want = forward_f64(spec, x.inputs()).map_err(|e| e.to_string())?;
        let grads =
            backward_f64(spec, x.inputs(), &want.o, &x.d_o, &want.stats).map_err(|e| e.to_string())?;
        let got = run_gpu::<T>(spec, &x, 0)?;
        // Positions in key coordinates: a query row i sits on the diagonal key i (+ Nk − Nq under a
        // bottom-right mask).
        let diag = |b: usize, is_row: bool| match (is_row, spec.causal()) {
            (true, Causal::BottomRight) => k_len(b).saturating_sub(q_len(b)),
            _ => 0,
        };
        let (pb, pn) = (at.0, at.1 + diag(at.0, matches!(t, Poisoned::Q | Poisoned::DO)));
        let near = |p: Option<(usize, usize)>, is_row: bool| {
            masked && p.is_some_and(|(eb, en)| eb == pb && (en + diag(eb, is_row)).abs_diff(pn) < MASKED_TILE)
        };
        for (name, g, r, c, pos, is_row) in [
            ("o", &got.o, &want.o, &clean.o, &rows_o, true),
            ("den", &got.lse, &want.stats, &clean.lse, &rows_stat, true),
            ("dq", &got.dq, &grads.dq, &clean.dq, &rows_dq, true),
            ("dk", &got.dk, &grads.dk, &clean.dk, &keys_dk, false),
            ("dv", &got.dv, &grads.dv, &clean.dv, &keys_dv, false),
        ] {
            let missing = (0..r.len()).filter(|&i| r[i].is_nan() && !g[i].is_nan()).count();
            let changed: Vec<usize> = (0..r.len())
                .filter(|&i| !r[i].is_nan() && g[i].to_bits() != c[i].to_bits())
                .filter(|&i| !(g[i].is_nan() && near(pos[i], is_row)))
                .collect();
            if missing > 0 || !changed.is_empty() {
                return Err(format!(
                    "{bad} in {t:?} row {at:?} col 3: {name}: {missing} of {} elements NaN in the reference are not NaN; \
                     {} elements the reference leaves alone changed (first: {:?})",
                    r.iter().filter(|v| v.is_nan()).count(),
                    changed.len(),
                    changed.first().map(|&i| (i, c[i], g[i], pos[i]))
                ));
            }
        }
    }
    Ok(())
}

/// The NaN contract of docs/nan.md (the Taylor row) on every Taylor kernel path: orders 1 (with and
/// without the l2-norm) and 2, f32/f16/bf16, head dims 32 and 64, causal (the single-pass order-1
/// forward where Nq = Nk) and not, with GQA; a NaN in a q, k, v or dO row. Each element the reference
/// makes NaN must be NaN; every other element bit-for-bit the unpoisoned run, except under a mask
/// within the poisoned row's tile, where it may be NaN ([`nan_contract`]).
#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn taylor_nan_follows_the_contract() {
    common::each_config(&common::taylor_configs(), || {
        let mut cases = Cases::new("taylor_nan_follows_the_contract");
        for fam in [ORDERS[0], ORDER1_PLAIN, ORDERS[1]] {
            for d in [32, 64] {
                for dtype in [DType::BF16, DType::F16, DType::F32] {
                    for (label, causal, nq) in [
                        ("causal Nq = Nk", Causal::TopLeft, 300),
                        ("bottom-right Nq < Nk", Causal::BottomRight, 200),
                        ("no mask", Causal::None, 300),
                    ] {
                        if !case_selected(d, dtype) {
                            cases.skip();
                            continue;
                        }
                        let spec = AttnProblem::new(fam, dtype, 2, 4, 2, nq, 300, d)
                            .with_causal(causal)
                            .validate()
                            .expect("valid");
                        let label = format!("{} D={d} {dtype} {label}", spec.family().label());
                        let r = match dtype {
                            DType::F32 => nan_contract::<f32>(&spec, 77),
                            DType::F16 => nan_contract::<f16>(&spec, 77),
                            DType::BF16 => nan_contract::<bf16>(&spec, 77),
                        };
                        cases.record(label, r);
                    }
                }
            }
        }
        cases.finish();
    });
}
