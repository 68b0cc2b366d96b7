//! Shared GPU test harness: one `check` per case compares every output and gradient by name with
//! the f64 reference (attn-cpu-ref) under REFERENCE.md's tolerance
//! `err(kernel) ≤ 2·err(naive same-dtype) + atol`, where the naive baseline ([`naive`]) is plain
//! attention in the storage dtype: inputs rounded, S, P, dP and dS rounded before the next
//! product, outputs rounded, sums accumulated in f32 (as a framework's matmul would).
//!
//! Every output buffer is poisoned with NaN before each launch, so an element the kernels fail to
//! write cannot pass.

#![allow(dead_code)] // each test binary uses part of the harness

pub mod bench;
pub mod hyperbolic;
pub mod shapes;

use attn_core::{AttnSpec, Element, FamilySpec};
use attn_cpu_ref::testing::{check_close, max_abs, random_case, Case};
use attn_cpu_ref::{backward_f64, forward_f64, Inputs};
use attn_cuda::cudarc::driver::CudaSlice;
use attn_cuda::{BackwardViews, CudaAttn, DeviceElem, ForwardViews};
use std::sync::OnceLock;

pub const GPU_ONLY: &str = "needs a CUDA GPU: cargo xtask test-gpu";

/// The GPU of this test process (device 0). Panics with a clear message when there is none: GPU
/// tests are `#[ignore]`d and only run when asked for (`--ignored`), on a machine that has one.
pub fn gpu() -> &'static CudaAttn {
    static GPU: OnceLock<CudaAttn> = OnceLock::new();
    GPU.get_or_init(|| match CudaAttn::new(0) {
        Ok(g) => g,
        Err(e) => panic!("GPU tests need a CUDA GPU: {e}"),
    })
}

fn round<T: Element>(x: &[f64]) -> (Vec<T>, Vec<f64>) {
    let t: Vec<T> = x.iter().map(|&v| T::from_f64(v)).collect();
    let r = t.iter().map(|v| v.to_f64()).collect();
    (t, r)
}

fn widen<T: Element>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// What one implementation produced.
#[derive(Clone, Debug)]
pub struct Outputs {
    pub o: Vec<f64>,
    pub lse: Vec<f64>,
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
    pub dbias: Option<Vec<f64>>,
}

/// Plain attention in dtype `T` (see the module doc), for softmax and cosine-sim.
#[allow(clippy::needless_range_loop)] // one index addresses several rows at once
pub fn naive<T: Element>(spec: &AttnSpec, x: Inputs<'_, f64>, d_o: &[f64]) -> Outputs {
    let rt = |v: f32| T::from_f32(v).to_f32();
    let d = spec.head_dim();
    let (scale, softcap, cosine_eps) = match *spec.family() {
        FamilySpec::Softmax { scale, softcap } => (scale, softcap, None),
        FamilySpec::CosineSim {
            scale,
            l2norm_qk,
            eps,
        } => (scale, None, l2norm_qk.then_some(eps)),
        ref other => panic!("no naive baseline for {other:?}"),
    };
    // Prepared rows: x̂ = x / max(‖x‖, eps) rounded to T (cosine-sim), else x; and ‖x‖.
    let prep = |buf: &[f64], off: usize| -> (Vec<f32>, f32) {
        let row: Vec<f32> = buf[off..off + d].iter().map(|&v| v as f32).collect();
        let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
        match cosine_eps {
            Some(eps) => (row.iter().map(|v| rt(v / norm.max(eps))).collect(), norm),
            None => (row, norm),
        }
    };
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    let mut out = Outputs {
        o: vec![0.0; spec.o_len()],
        lse: vec![f64::NEG_INFINITY; spec.stats_len()],
        dq: vec![0.0; spec.dq_len()],
        dk: vec![0.0; spec.dk_len()],
        dv: vec![0.0; spec.dv_len()],
        dbias: spec.bias().map(|_| vec![0.0; spec.bias_len()]),
    };
    // dk̂, dv accumulated in f32 per key row, then rounded.
    let mut dk_acc = vec![0f32; spec.dk_len()];
    let mut dv_acc = vec![0f32; spec.dv_len()];
    let mut db_acc = vec![0f32; spec.bias_len()];
    for b in 0..spec.batch() {
        let lens = spec.seq_lens(b);
        for h in 0..spec.heads_q() {
            let hk = spec.kv_head(h);
            for i in 0..lens.q {
                let keys = spec.key_range(b, i);
                if keys.is_empty() {
                    continue;
                }
                let (qh, _) = prep(x.q, spec.q_offset(b, i, h));
                let krows: Vec<(Vec<f32>, f32)> =
                    keys.clone().map(|j| prep(x.k, spec.k_offset(b, j, hk))).collect();
                // s = score + bias, rounded; t = tanh term for the softcap derivative.
                let mut s = Vec::with_capacity(keys.len());
                let mut sigma = Vec::with_capacity(keys.len());
                for (jj, j) in keys.clone().enumerate() {
                    let raw = scale * dot(&qh, &krows[jj].0);
                    let (sc, sg) = match softcap {
                        Some(cap) => {
                            let t = (raw / cap).tanh();
                            (cap * t, scale * (1.0 - t * t))
                        }
                        None => (raw, scale),
                    };
                    let bias = spec
                        .bias_index(b, h, i, j)
                        .map(|bi| x.bias.expect("bias")[bi] as f32)
                        .unwrap_or(0.0);
                    s.push(rt(sc + bias));
                    sigma.push(sg);
                }
                let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                if m == f32::NEG_INFINITY {
                    continue;
                }
                let e: Vec<f32> = s.iter().map(|v| (v - m).exp()).collect();
                let sum: f32 = e.iter().sum();
                let p: Vec<f32> = e.iter().map(|v| rt(v / sum)).collect();
                let oo = spec.o_offset(b, i, h);
                let mut o_row = vec![0f32; d];
                for (jj, j) in keys.clone().enumerate() {
                    let vo = spec.v_offset(b, j, hk);
                    for c in 0..d {
                        o_row[c] += p[jj] * x.v[vo + c] as f32;
                    }
                }
                let o_row: Vec<f32> = o_row.into_iter().map(rt).collect();
                for c in 0..d {
                    out.o[oo + c] = o_row[c] as f64;
                }
                out.lse[spec.stats_index(b, h, i)] = (m + sum.ln()) as f64;
                // Backward.
                let g: Vec<f32> = d_o[oo..oo + d].iter().map(|&v| v as f32).collect();
                let delta = dot(&g, &o_row);
                let mut dqh = vec![0f32; d];
                for (jj, j) in keys.clone().enumerate() {
                    let vo = spec.v_offset(b, j, hk);
                    let vrow: Vec<f32> = x.v[vo..vo + d].iter().map(|&v| v as f32).collect();
                    let dp = rt(dot(&g, &vrow));
                    let ds = rt(p[jj] * (dp - delta));
                    if let Some(bi) = spec.bias_index(b, h, i, j) {
                        db_acc[bi] += ds;
                    }
                    let w = ds * sigma[jj];
                    let ko = spec.dk_offset(b, j, hk);
                    let dvo = spec.dv_offset(b, j, hk);
                    for c in 0..d {
                        dqh[c] += w * krows[jj].0[c];
                        dk_acc[ko + c] += w * qh[c];
                        dv_acc[dvo + c] += p[jj] * g[c];
                    }
                }
                let dqh: Vec<f32> = dqh.into_iter().map(rt).collect();
                let dq = match cosine_eps {
                    Some(eps) => l2norm_bwd(&qh, &dqh, prep(x.q, spec.q_offset(b, i, h)).1, eps),
                    None => dqh,
                };
                let qo = spec.dq_offset(b, i, h);
                for c in 0..d {
                    out.dq[qo + c] = rt(dq[c]) as f64;
                }
            }
        }
        // dk: through the l2-norm per key row (cosine-sim), then rounded.
        let rows_k = if spec.is_varlen() { lens.k } else { spec.seq_k() };
        for hk in 0..spec.heads_kv() {
            for j in 0..rows_k {
                let ko = spec.dk_offset(b, j, hk);
                let dkh: Vec<f32> = dk_acc[ko..ko + d].iter().map(|&v| rt(v)).collect();
                let dk = match cosine_eps {
                    Some(eps) => {
                        let (kh, norm) = prep(x.k, spec.k_offset(b, j, hk));
                        l2norm_bwd(&kh, &dkh, norm, eps)
                    }
                    None => dkh,
                };
                let vo = spec.dv_offset(b, j, hk);
                for c in 0..d {
                    out.dk[ko + c] = rt(dk[c]) as f64;
                    out.dv[vo + c] = rt(dv_acc[vo + c]) as f64;
                }
            }
        }
    }
    if let Some(db) = out.dbias.as_mut() {
        for (o, a) in db.iter_mut().zip(&db_acc) {
            *o = rt(*a) as f64;
        }
    }
    out
}

/// `dx = (dx̂ − x̂ (x̂·dx̂)) / ‖x‖` where `‖x‖ > eps`, else `dx̂ / eps`.
fn l2norm_bwd(xh: &[f32], dxh: &[f32], norm: f32, eps: f32) -> Vec<f32> {
    if norm > eps {
        let xd: f32 = xh.iter().zip(dxh).map(|(a, b)| a * b).sum();
        xh.iter().zip(dxh).map(|(x, g)| (g - x * xd) / norm).collect()
    } else {
        dxh.iter().map(|g| g / eps).collect()
    }
}

fn upload<T: DeviceElem>(data: &[T]) -> CudaSlice<T> {
    gpu().stream().clone_htod(data).expect("upload")
}

fn poisoned<T: DeviceElem>(n: usize) -> CudaSlice<T> {
    upload(&vec![T::from_f64(f64::NAN); n.max(1)])
}

fn download<T: DeviceElem>(s: &CudaSlice<T>, n: usize) -> Vec<f64> {
    let v: Vec<T> = gpu().stream().clone_dtoh(s).expect("download");
    widen(&v[..n])
}

/// Run forward and backward of `spec` on the GPU for the (already rounded) case inputs, through
/// the view entry points with inputs starting at element `offset` of their buffers.
pub fn run_gpu<T: DeviceElem>(spec: &AttnSpec, case: &Case, offset: usize) -> Result<Outputs, String> {
    let g = gpu();
    let with_offset = |x: &[f64]| -> CudaSlice<T> {
        let mut v = vec![T::from_f64(f64::NAN); offset];
        v.extend(x.iter().map(|&e| T::from_f64(e)));
        upload(&v)
    };
    let q = with_offset(&case.q);
    let k = with_offset(&case.k);
    let v = with_offset(&case.v);
    let bias = case.bias.as_ref().map(|b| with_offset(b));
    let d_o = upload(&case.d_o.iter().map(|&e| T::from_f64(e)).collect::<Vec<T>>());
    let mut o = poisoned::<T>(spec.o_len());
    let mut lse = poisoned::<f32>(spec.stats_len());
    let e = |e: attn_cuda::CudaAttnError| e.to_string();
    g.forward_views(
        spec,
        ForwardViews {
            q: q.slice(offset..),
            k: k.slice(offset..),
            v: v.slice(offset..),
            bias: bias.as_ref().map(|b| b.slice(offset..)),
            o: o.slice_mut(..),
            lse: lse.slice_mut(..),
        },
    )
    .map_err(e)?;
    let mut dq = poisoned::<T>(spec.dq_len());
    let mut dk = poisoned::<T>(spec.dk_len());
    let mut dv = poisoned::<T>(spec.dv_len());
    let mut dbias = spec.bias().map(|_| poisoned::<T>(spec.bias_len()));
    g.backward_views(
        spec,
        BackwardViews {
            q: q.slice(offset..),
            k: k.slice(offset..),
            v: v.slice(offset..),
            bias: bias.as_ref().map(|b| b.slice(offset..)),
            o: o.slice(..),
            d_o: d_o.slice(..),
            lse: lse.slice(..),
            dq: dq.slice_mut(..),
            dk: dk.slice_mut(..),
            dv: dv.slice_mut(..),
            dbias: dbias.as_mut().map(|b| b.slice_mut(..)),
        },
    )
    .map_err(e)?;
    g.stream().synchronize().map_err(|e| e.to_string())?;
    Ok(Outputs {
        o: download(&o, spec.o_len()),
        lse: download(&lse, spec.stats_len()),
        dq: download(&dq, spec.dq_len()),
        dk: download(&dk, spec.dk_len()),
        dv: download(&dv, spec.dv_len()),
        dbias: dbias.as_ref().map(|b| download(b, spec.bias_len())),
    })
}

/// Compare the LSE: −∞ exactly where the reference has an empty row, close elsewhere.
fn check_lse(got: &[f64], reference: &[f64], baseline: &[f64], atol: f64) -> Result<(), String> {
    let mut g = Vec::new();
    let mut r = Vec::new();
    let mut b = Vec::new();
    for i in 0..reference.len() {
        let empty = reference[i] == f64::NEG_INFINITY;
        if empty != (got[i] == f64::NEG_INFINITY) {
            return Err(format!(
                "lse[{i}]: got {} where the reference has {}",
                got[i], reference[i]
            ));
        }
        if !empty {
            g.push(got[i]);
            r.push(reference[i]);
            b.push(baseline[i]);
        }
    }
    check_close("lse", &g, &r, &b, atol)
}

/// Unit roundoff of the storage dtype.
fn unit<T: Element>() -> f64 {
    T::DTYPE.unit_roundoff()
}

/// One case: random inputs (seeded), rounded to `T`; the f64 reference on the rounded inputs; the
/// naive same-dtype baseline; the GPU. Every tensor is compared by name.
pub fn check<T: DeviceElem>(spec: &AttnSpec, seed: u64, offset: usize) -> Result<(), String> {
    let mut case = random_case(spec, seed);
    for x in [&mut case.q, &mut case.k, &mut case.v, &mut case.d_o] {
        *x = round::<T>(x).1;
    }
    if let Some(b) = case.bias.as_mut() {
        *b = round::<T>(b).1;
    }
    let reference = forward_f64(spec, case.inputs()).map_err(|e| e.to_string())?;
    let grads = backward_f64(spec, case.inputs(), &reference.o, &case.d_o, &reference.stats)
        .map_err(|e| e.to_string())?;
    let base = naive::<T>(spec, case.inputs(), &case.d_o);
    let got = run_gpu::<T>(spec, &case, offset)?;
    let atol = |r: &[f64]| 4.0 * unit::<T>() * max_abs(r).max(1e-3);
    let ctx = |e: String| format!("{} {} seed {seed}: {e}", spec.family().label(), T::DTYPE);
    check_close("o", &got.o, &reference.o, &base.o, atol(&reference.o)).map_err(ctx)?;
    let lse_ref: Vec<f64> = reference.stats.clone();
    check_lse(&got.lse, &lse_ref, &base.lse, atol(&[1.0])).map_err(ctx)?;
    check_close("dq", &got.dq, &grads.dq, &base.dq, atol(&grads.dq)).map_err(ctx)?;
    check_close("dk", &got.dk, &grads.dk, &base.dk, atol(&grads.dk)).map_err(ctx)?;
    check_close("dv", &got.dv, &grads.dv, &base.dv, atol(&grads.dv)).map_err(ctx)?;
    if let (Some(g), Some(r), Some(b)) = (&got.dbias, &grads.dbias, &base.dbias) {
        check_close("dbias", g, r, b, atol(r)).map_err(ctx)?;
    }
    Ok(())
}

/// Run `check` over the dtypes for one spec builder; collect every failure, so one run reports
/// them all. Returns the number of cases checked.
pub fn check_all_dtypes(
    make: &dyn Fn(attn_core::DType) -> Option<AttnSpec>,
    seed: u64,
    offset: usize,
    failures: &mut Vec<String>,
) -> usize {
    let mut n = 0;
    for dtype in attn_core::DType::ALL {
        let Some(spec) = make(dtype) else { continue };
        let r = match dtype {
            attn_core::DType::F32 => check::<f32>(&spec, seed, offset),
            attn_core::DType::F16 => check::<half::f16>(&spec, seed, offset),
            attn_core::DType::BF16 => check::<half::bf16>(&spec, seed, offset),
        };
        n += 1;
        if let Err(e) = r {
            failures.push(format!("D={} {}: {e}", spec.head_dim(), dtype));
        }
    }
    n
}
