//! The fast CPU path: softmax, cosine-sim, hyperbolic and Taylor attention with f32 accumulation,
//! the softmax-like families FlashAttention-2 shaped, Taylor through chunked factorised states
//! (docs/cpu.md). The f64 reference stays the oracle; this path is what attn-candle runs on CPU
//! tensors.
//!
//! - Inputs in f32, f16 or bf16 are converted to f32 once, into prepared rows per (batch, head)
//!   slice (the family's embedding applied: l2-normalised rows for cosine-sim, unit rows and
//!   Lorentz scalars for hyperbolic), gathered through the spec's offsets.
//! - Forward: one task per (batch, query head, tile of [`tile::BQ`] queries, key split); each walks
//!   the keys its rows may see in tiles of [`tile::BK`], scores by GEMM (`gemm` crate), keeps the
//!   online softmax's running max and sum, and accumulates `P·V` by GEMM: no Nq×Nk buffer. When
//!   the (batch, head, query tile) tasks are few, the keys are split and the parts merged through
//!   their LSE. One query per sequence on a dot-product score runs the decode kernel
//!   (`fast/decode.rs`), which reads the cache once for every head (f32 in place).
//! - Work partitions depend on the shape alone (never the thread count): outputs and gradients
//!   are bit-identical under any number of threads. The path's own loops are compiled for the
//!   baseline, AVX2 and AVX-512 and chosen at run time (`fast/simd.rs`).
//! - Backward: one task per (batch, kv head, key chunk) recomputes `P` tile by tile from the saved
//!   LSE, accumulates dK and dV of its keys and its own dQ partial for the GQA group's queries
//!   (the key chunks of one slice are summed in a fixed order afterwards: no races, and the result
//!   does not depend on scheduling). dbias runs as a separate pass per bias row tile.
//! - Masks come from `AttnSpec::key_range` only, as everywhere else.
//!
//! Taylor attention runs through its factorised states, chunked (`fast/taylor/`, its module doc);
//! its recurrent decode ([`decode_taylor`]) keeps those states between calls.

mod backward;
mod decode;
mod forward;
mod simd;
mod taylor;
#[cfg(test)]
mod tests;
mod tile;

pub use taylor::decode as decode_taylor;

use crate::{check_inputs, Forward, Gradients, Inputs};
use attn_core::{Aggregation, AttnError, AttnSpec, Element, FamilySpec, Pass, Result};
use rayon::prelude::*;
use tile::{log_gamma, Kind, RowS, Rows};

/// Whether the fast path covers the spec's family (softmax, cosine-sim, hyperbolic, Taylor).
pub fn supports(spec: &AttnSpec) -> bool {
    Kind::new(spec.family()).is_some() || taylor::covers(spec)
}

/// The softmax-like score of the spec, or `None` for Taylor (run by `taylor`).
fn check<E: Element>(spec: &AttnSpec, pass: Pass) -> Result<Option<Kind>> {
    if E::DTYPE != spec.dtype() {
        return Err(AttnError::InvalidArgument {
            op: spec.op(pass),
            arg: "dtype",
            reason: format!("buffers are {} but the spec says {}", E::DTYPE, spec.dtype()),
        });
    }
    if taylor::covers(spec) {
        return Ok(None);
    }
    Kind::new(spec.family())
        .map(Some)
        .ok_or_else(|| AttnError::Unsupported {
            op: spec.op(pass),
            backend: "attn-cpu-ref::fast",
            what: format!(
                "the {} family (the fast path covers softmax, cosine-sim, hyperbolic and Taylor)",
                spec.family().label()
            ),
        })
}

/// Which tensor a slice gathers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Which {
    Q,
    K,
    V,
}

/// Everything a task reads: the spec, the score and the prepared rows of every slice.
struct Ctx<'a, E> {
    spec: &'a AttnSpec,
    kind: Kind,
    /// The curvature when values aggregate by Einstein midpoint.
    midpoint: Option<f32>,
    q: Vec<Rows<'a>>,
    k: Vec<Rows<'a>>,
    v: Vec<Rows<'a>>,
    bias: Option<&'a [E]>,
}

impl<'a, E: Element> Ctx<'a, E> {
    fn new(spec: &'a AttnSpec, kind: Kind, x: &Inputs<'a, E>) -> Ctx<'a, E> {
        Ctx::build(spec, kind, x, false)
    }

    /// With `decode`, for the decode kernel (`decode.rs`, a dot-product score without the Einstein
    /// midpoint): k and v rows are read in place from f32 storage (a slice's offsets are affine
    /// in the row: one stride), and for other storage hold no data (the kernel converts them
    /// tile by tile). Otherwise every row is a contiguous f32 copy: the GEMMs of the general path
    /// re-read each k and v tile once per query tile, and rows a whole token apart in the input
    /// (`H·D` values) would cost them a TLB miss per row and 4 KiB cache-set aliasing.
    fn build(spec: &'a AttnSpec, kind: Kind, x: &Inputs<'a, E>, decode: bool) -> Ctx<'a, E> {
        let midpoint = match *spec.family() {
            FamilySpec::Hyperbolic {
                aggregation: Aggregation::EinsteinMidpoint,
                curvature,
                ..
            } => Some(curvature),
            _ => None,
        };
        let gather = |w: Which, src: &'a [E]| -> Vec<Rows<'a>> {
            let heads = if w == Which::Q {
                spec.heads_q()
            } else {
                spec.heads_kv()
            };
            let slice = |bh: usize| {
                let (b, h) = (bh / heads, bh % heads);
                let lens = spec.seq_lens(b);
                let (n, dim) = match w {
                    Which::Q => (lens.q, spec.head_dim()),
                    Which::K => (lens.k, spec.head_dim()),
                    Which::V => (lens.k, spec.head_dim_v()),
                };
                if decode && w != Which::Q {
                    let base = |r| match w {
                        Which::K => spec.k_offset(b, r, h),
                        _ => spec.v_offset(b, r, h),
                    };
                    let rs = if n > 1 { base(1) - base(0) } else { dim };
                    return Rows::borrow(src, base(0), rs, n, dim).unwrap_or_else(|| Rows {
                        dim,
                        rs: dim,
                        data: Vec::new().into(),
                        s: Vec::new(),
                        extra: vec![0.0; n],
                        bad: Vec::new(),
                    });
                }
                let mut data = vec![0f32; n * dim];
                let mut s = Vec::with_capacity(n);
                let mut extra = Vec::with_capacity(n);
                let mut raw = vec![0f32; dim];
                for (r, out) in data.chunks_exact_mut(dim.max(1)).take(n).enumerate() {
                    let at = match w {
                        Which::Q => spec.q_offset(b, r, h),
                        Which::K => spec.k_offset(b, r, h),
                        Which::V => spec.v_offset(b, r, h),
                    };
                    raw.iter_mut()
                        .zip(&src[at..at + dim])
                        .for_each(|(o, x)| *o = x.to_f32());
                    match w {
                        Which::V => {
                            out.copy_from_slice(&raw);
                            s.push(RowS::default());
                            extra.push(midpoint.map_or(0.0, |c| log_gamma(c, &raw).0));
                        }
                        _ => {
                            s.push(kind.prepare(&raw, out));
                            extra.push(0.0);
                        }
                    }
                }
                Rows {
                    dim,
                    rs: dim,
                    bad: tile::bad_rows(&data, dim),
                    data: data.into(),
                    s,
                    extra,
                }
            };
            // Decode borrows k and v and prepares one query row per head: less work than waking
            // the pool for it.
            if decode {
                (0..spec.batch() * heads).map(slice).collect()
            } else {
                (0..spec.batch() * heads).into_par_iter().map(slice).collect()
            }
        };
        Ctx {
            spec,
            kind,
            midpoint,
            q: gather(Which::Q, x.q),
            k: gather(Which::K, x.k),
            v: gather(Which::V, x.v),
            bias: x.bias,
        }
    }

    fn q(&self, b: usize, h: usize) -> &Rows<'a> {
        &self.q[b * self.spec.heads_q() + h]
    }
    fn k(&self, b: usize, hk: usize) -> &Rows<'a> {
        &self.k[b * self.spec.heads_kv() + hk]
    }
    fn v(&self, b: usize, hk: usize) -> &Rows<'a> {
        &self.v[b * self.spec.heads_kv() + hk]
    }

    /// Logits of the tile (query rows `i0..i0+m`, keys `j0..j0+n`) of slice (b, h), from the dot
    /// products already in `s` (row stride `n`): score, bias, `log γ_j`, and −∞ outside each
    /// row's key range. Writes σ when `sigma` is given.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn logits(
        &self,
        b: usize,
        h: usize,
        i0: usize,
        m: usize,
        j0: usize,
        n: usize,
        s: &mut [f32],
        mut sigma: Option<&mut [f32]>,
    ) {
        let hk = self.spec.kv_head(h);
        let (q, k, v) = (self.q(b, h), self.k(b, hk), self.v(b, hk));
        for r in 0..m {
            let i = i0 + r;
            let range = self.spec.key_range(b, i);
            let row = &mut s[r * n..(r + 1) * n];
            let bias = self
                .bias
                .zip(self.spec.bias_index(b, h, i, j0))
                .map(|(x, at)| &x[at..at + n]);
            let qs = &q.scalars(i);
            // Columns of the tile inside the row's key range; the rest is masked.
            let lo = range.start.clamp(j0, j0 + n) - j0;
            let hi = range.end.clamp(j0, j0 + n) - j0;
            let hi = hi.max(lo);
            row[..lo].fill(f32::NEG_INFINITY);
            row[hi..].fill(f32::NEG_INFINITY);
            let sig = sigma.as_deref_mut().map(|sg| &mut sg[r * n..(r + 1) * n]);
            if let Some(sg) = sig {
                sg[..lo].fill(0.0);
                sg[hi..].fill(0.0);
                for c in lo..hi {
                    let (sc, g) = self.kind.score(row[c], qs, &k.scalars(j0 + c));
                    row[c] = sc;
                    sg[c] = g;
                }
            } else {
                match self.kind {
                    // A dot product of rows used as is is non-finite where a row holds ±∞ or NaN:
                    // NaN, as a prepared row would make it (docs/nan.md).
                    Kind::Dot { scale, softcap: None } => row[lo..hi]
                        .iter_mut()
                        .for_each(|x| *x = if x.is_finite() { *x * scale } else { f32::NAN }),
                    Kind::Cosine { scale, .. } => row[lo..hi].iter_mut().for_each(|x| *x *= scale),
                    kind => {
                        for (c, x) in row[lo..hi].iter_mut().enumerate() {
                            *x = kind.score(*x, qs, &k.scalars(j0 + lo + c)).0;
                        }
                    }
                }
            }
            if let Some(bias) = bias {
                row[lo..hi]
                    .iter_mut()
                    .zip(&bias[lo..hi])
                    .for_each(|(x, b)| *x += b.to_f32());
            }
            if self.midpoint.is_some() {
                row[lo..hi]
                    .iter_mut()
                    .zip(&v.extra[j0 + lo..j0 + hi])
                    .for_each(|(x, g)| *x += g);
            }
        }
    }
}

/// Forward pass: o in the storage dtype, the LSE in f32 (−∞ for a row with no allowed key; Taylor:
/// the denominator, 0 there), f32 accumulation. Same contract as [`crate::forward`].
pub fn forward<E: Element>(spec: &AttnSpec, x: Inputs<'_, E>) -> Result<Forward<E, f32>> {
    let kind = check::<E>(spec, Pass::Forward)?;
    check_inputs(spec, Pass::Forward, &x)?;
    if crate::is_empty_call(spec) {
        return Ok(crate::empty_forward(
            spec,
            E::from_f64(0.0),
            f32::NEG_INFINITY,
            0.0,
        ));
    }
    let Some(kind) = kind else {
        return Ok(taylor::forward(spec, &x));
    };
    let level = simd::Level::detect();
    if decode::applies(spec, kind) {
        let ctx = Ctx::build(spec, kind, &x, true);
        return Ok(decode::run(&ctx, &x, level));
    }
    let ctx = Ctx::new(spec, kind, &x);
    Ok(forward::run(&ctx, level))
}

/// One step against a KV cache ([`crate::kv_cache::forward_kv_cache`]'s checks, append and
/// gather) with the attention on this fast path.
pub fn forward_kv_cache<E: Element>(
    spec: &attn_core::KvCacheSpec,
    io: crate::kv_cache::KvCacheIo<'_, E>,
) -> Result<Forward<E, f32>> {
    crate::kv_cache::step(spec, io, forward)
}

/// Backward pass given the forward's o and LSE: dq, dk, dv (and dbias) in the storage dtype, f32
/// accumulation. Same contract as [`crate::backward`].
pub fn backward<E: Element>(
    spec: &AttnSpec,
    x: Inputs<'_, E>,
    o: &[E],
    d_o: &[E],
    stats: &[f32],
) -> Result<Gradients<E>> {
    let kind = check::<E>(spec, Pass::Backward)?;
    check_inputs(spec, Pass::Backward, &x)?;
    spec.check_len(Pass::Backward, "o", o.len(), spec.o_len())?;
    spec.check_len(Pass::Backward, "d_o", d_o.len(), spec.o_len())?;
    spec.check_len(Pass::Backward, "stats", stats.len(), spec.stats_len())?;
    if crate::is_empty_call(spec) {
        return Ok(crate::empty_gradients(spec, E::from_f64(0.0)));
    }
    let Some(kind) = kind else {
        return Ok(taylor::backward(spec, &x, o, d_o, stats));
    };
    let ctx = Ctx::new(spec, kind, &x);
    Ok(backward::run(&ctx, o, d_o, stats, simd::Level::detect()))
}
