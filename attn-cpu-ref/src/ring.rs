//! Context parallelism in sequential mode: the ring schedule of [`attn_core::RingSpec`] run on the
//! host, one rank after another, in f64 through [`crate::forward_f64`] and [`crate::backward_f64`].
//! It is the oracle a multi-device driver is tested against, and the check that the plan's blocks,
//! masks and merges reproduce the single-device call (`tests/ring.rs`).
//!
//! Every rank's tensors are its shard, `[B, 2C, H, D]` (its two chunks concatenated, see
//! [`attn_core::RingSpec::chunks`]), statistics `[B, Hq, 2C]`; [`shard`] and [`unshard`] move
//! between them and the global `[B, N, H, D]` tensors.
//!
//! - Forward: in step `t` rank `r` attends its two query chunks to the two key chunks of rank
//!   `(r − t) mod W`, block by block ([`attn_core::Block`]), and merges each block's `(o, stat)`
//!   into its rows' running `(o, stat)` ([`attn_core::Merge`]): for the softmax-like families
//!   `lse = log(e^{lse} + e^{lse_b})`, `o ← e^{lse_old − lse} o + e^{lse_b − lse} o_b`, a NaN in
//!   either LSE making the row NaN (docs/nan.md); for Taylor `den = den_old + den_b`,
//!   `o ← (den_old o + den_b o_b) / den`. (A distributed Taylor driver would pass each rank's
//!   folded states, `O(D²·Dv)` per head, through a prefix scan instead of its keys and values; the
//!   block sums are the same.)
//! - Backward: the same schedule with the merged o and statistic. A block's gradients are exact
//!   pieces of the whole call's (`P_ij = e^{s_ij − LSE_i}` with the global LSE, `δ_i = dO_i·o_i` with
//!   the global o; Taylor's `ĝ_i = dO_i / den_i` with the global denominator): dq adds to the rank's own, dk and dv to the accumulators of the key shard, which a
//!   distributed driver sends around the ring with the keys and values (here they are indexed by the
//!   shard's owner, and receive their contributions in the same step order).

use crate::{Forward, Gradients, Inputs};
use attn_core::{AttnError, AttnSpec, Merge, Pass, Result, RingSpec};

fn length_error(spec: &RingSpec, what: String, want: usize, got: usize) -> AttnError {
    AttnError::ShapeMismatch {
        op: spec.global().op(Pass::Spec),
        what,
        expected: format!("{want} elements"),
        got: format!("{got}"),
    }
}

/// Rank `rank`'s shard `[B, 2C, heads, dim]` of a global `[B, N, heads, dim]` tensor
/// (`width = heads · dim`). Errors: `x` not `B·N·width` long, `rank ≥ W`.
pub fn shard<T: Copy>(spec: &RingSpec, x: &[T], width: usize, rank: usize) -> Result<Vec<T>> {
    let (b, n, c2) = (spec.global().batch(), spec.global().seq_q(), 2 * spec.chunk());
    let want = b.checked_mul(n).and_then(|x| x.checked_mul(width));
    if want != Some(x.len()) {
        return Err(length_error(
            spec,
            format!("the global tensor of width {width}"),
            want.unwrap_or(usize::MAX),
            x.len(),
        ));
    }
    if rank >= spec.world() {
        return Err(AttnError::InvalidArgument {
            op: spec.global().op(Pass::Spec),
            arg: "rank",
            reason: format!("rank {rank} of a ring of {} ranks", spec.world()),
        });
    }
    let mut out = Vec::with_capacity(b * c2 * width);
    for bi in 0..b {
        for i in 0..c2 {
            let row = (bi * n + spec.global_row(rank, i)) * width;
            out.extend_from_slice(&x[row..row + width]);
        }
    }
    Ok(out)
}

/// The global `[B, N, heads, dim]` tensor from every rank's `[B, 2C, heads, dim]` shard (`shards[r]`
/// is rank `r`'s). Errors: not one shard per rank, or a shard not `B·2C·width` long.
pub fn unshard<T: Copy + Default>(spec: &RingSpec, shards: &[Vec<T>], width: usize) -> Result<Vec<T>> {
    let (b, n, c2) = (spec.global().batch(), spec.global().seq_q(), 2 * spec.chunk());
    check_shards(spec, shards, b.checked_mul(c2).and_then(|x| x.checked_mul(width)))?;
    let mut out = vec![T::default(); b * n * width];
    for (rank, s) in shards.iter().enumerate() {
        for bi in 0..b {
            for i in 0..c2 {
                let src = (bi * c2 + i) * width;
                let dst = (bi * n + spec.global_row(rank, i)) * width;
                out[dst..dst + width].copy_from_slice(&s[src..src + width]);
            }
        }
    }
    Ok(out)
}

/// The global statistics `[B, Hq, N]` from every rank's `[B, Hq, 2C]`.
pub fn unshard_stats<T: Copy + Default>(spec: &RingSpec, shards: &[Vec<T>]) -> Result<Vec<T>> {
    let g = spec.global();
    let (b, h, n, c2) = (g.batch(), g.heads_q(), g.seq_q(), 2 * spec.chunk());
    check_shards(spec, shards, Some(spec.local().stats_len()))?;
    let mut out = vec![T::default(); b * h * n];
    for (rank, s) in shards.iter().enumerate() {
        for bh in 0..b * h {
            for i in 0..c2 {
                out[bh * n + spec.global_row(rank, i)] = s[bh * c2 + i];
            }
        }
    }
    Ok(out)
}

fn check_shards<T>(spec: &RingSpec, shards: &[Vec<T>], want: Option<usize>) -> Result<()> {
    check_ranks(spec, Pass::Spec, "shards", shards.len())?;
    let want = want.unwrap_or(usize::MAX);
    match shards.iter().position(|s| s.len() != want) {
        Some(r) => Err(length_error(
            spec,
            format!("the shard of rank {r}"),
            want,
            shards[r].len(),
        )),
        None => Ok(()),
    }
}

/// Rows `half·C .. (half+1)·C` of every batch entry of a `[B, 2C, width]` shard.
fn half(x: &[f64], batch: usize, chunk: usize, width: usize, which: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(batch * chunk * width);
    for b in 0..batch {
        let start = (b * 2 * chunk + which * chunk) * width;
        out.extend_from_slice(&x[start..start + chunk * width]);
    }
    out
}

/// `x[rows of half] += y` for a `[B, C, width]` block.
fn add_half(x: &mut [f64], y: &[f64], batch: usize, chunk: usize, width: usize, which: usize) {
    for b in 0..batch {
        let start = (b * 2 * chunk + which * chunk) * width;
        let dst = &mut x[start..start + chunk * width];
        let src = &y[b * chunk * width..(b + 1) * chunk * width];
        dst.iter_mut().zip(src).for_each(|(d, s)| *d += s);
    }
}

/// The statistics of one half of a `[B, Hq, 2C]` shard, `[B, Hq, C]`.
fn stats_half(x: &[f64], bh: usize, chunk: usize, which: usize) -> Vec<f64> {
    (0..bh)
        .flat_map(|r| x[r * 2 * chunk + which * chunk..][..chunk].iter().copied())
        .collect()
}

fn check_ranks(spec: &RingSpec, pass: Pass, what: &str, n: usize) -> Result<()> {
    if n == spec.world() {
        return Ok(());
    }
    Err(AttnError::ShapeMismatch {
        op: spec.global().op(pass),
        what: format!("{what} (one per rank)"),
        expected: format!("{} ranks", spec.world()),
        got: format!("{n}"),
    })
}

fn check_shard(spec: &RingSpec, pass: Pass, rank: usize, x: &Inputs<'_, f64>) -> Result<()> {
    let l = spec.local();
    for (name, got, want) in [
        ("q", x.q.len(), l.q_len()),
        ("k", x.k.len(), l.k_len()),
        ("v", x.v.len(), l.v_len()),
    ] {
        if got != want {
            return Err(AttnError::ShapeMismatch {
                op: spec.global().op(pass),
                what: format!("{name} of rank {rank}"),
                expected: format!("{want} elements ({:?} per rank)", l.q_shape()),
                got: format!("{got}"),
            });
        }
    }
    if x.bias.is_some() {
        return Err(AttnError::Unsupported {
            op: spec.global().op(pass),
            backend: "context parallelism",
            what: "a bias".into(),
        });
    }
    Ok(())
}

/// Shapes of one rank's buffers.
struct Dims {
    batch: usize,
    heads_q: usize,
    chunk: usize,
    dq_width: usize,
    dk_width: usize,
    dv_width: usize,
    o_width: usize,
    head_dim_v: usize,
}

impl Dims {
    fn of(spec: &RingSpec) -> Dims {
        let g: &AttnSpec = spec.global();
        Dims {
            batch: g.batch(),
            heads_q: g.heads_q(),
            chunk: spec.chunk(),
            dq_width: g.heads_q() * g.head_dim(),
            dk_width: g.heads_kv() * g.head_dim(),
            dv_width: g.heads_kv() * g.head_dim_v(),
            o_width: g.heads_q() * g.head_dim_v(),
            head_dim_v: g.head_dim_v(),
        }
    }
}

/// Merge a block's `(o_b, stat_b)` (`[B, C, Hq, Dv]`, `[B, Hq, C]`) into rows `which` of a rank's
/// running `(o, stat)` (`[B, 2C, Hq, Dv]`, `[B, Hq, 2C]`), by [`Merge`].
fn merge(acc: &mut Forward<f64, f64>, part: &Forward<f64, f64>, d: &Dims, how: Merge, which: usize) {
    let (c, hq, dv) = (d.chunk, d.heads_q, d.head_dim_v);
    for b in 0..d.batch {
        for h in 0..hq {
            for i in 0..c {
                let li = which * c + i;
                let s_acc = &mut acc.stats[(b * hq + h) * 2 * c + li];
                let s_part = part.stats[(b * hq + h) * c + i];
                // The weights of the running and the new part, and the merged statistic.
                let (wa, wb, stat) = match how {
                    Merge::LogSumExp => {
                        if s_part == f64::NEG_INFINITY {
                            continue; // no key of this block: nothing to add
                        }
                        let m = if s_acc.is_nan() || s_part.is_nan() {
                            f64::NAN
                        } else {
                            s_acc.max(s_part)
                        };
                        let lse = m + ((*s_acc - m).exp() + (s_part - m).exp()).ln();
                        ((*s_acc - lse).exp(), (s_part - lse).exp(), lse)
                    }
                    Merge::Denominator => {
                        let den = *s_acc + s_part;
                        (*s_acc / den, s_part / den, den)
                    }
                };
                *s_acc = stat;
                let o = &mut acc.o[((b * 2 * c + li) * hq + h) * dv..][..dv];
                let ob = &part.o[((b * c + i) * hq + h) * dv..][..dv];
                o.iter_mut().zip(ob).for_each(|(x, y)| *x = wa * *x + wb * y);
            }
        }
    }
}

/// Forward of a context-parallel call: `x[r]` is rank `r`'s shard; returns each rank's o
/// (`[B, 2C, Hq, Dv]`) and LSE (`[B, Hq, 2C]`), equal to the rows of the single-device call.
pub fn forward_f64(spec: &RingSpec, x: &[Inputs<'_, f64>]) -> Result<Vec<Forward<f64, f64>>> {
    check_ranks(spec, Pass::Forward, "inputs", x.len())?;
    for (r, xr) in x.iter().enumerate() {
        check_shard(spec, Pass::Forward, r, xr)?;
    }
    let d = Dims::of(spec);
    let local = spec.local();
    // The statistic of a row with no key yet: LSE −∞, or a denominator of 0.
    let empty = match spec.merge() {
        Merge::LogSumExp => f64::NEG_INFINITY,
        Merge::Denominator => 0.0,
    };
    let mut acc: Vec<Forward<f64, f64>> = (0..spec.world())
        .map(|_| Forward {
            o: vec![0.0; local.o_len()],
            stats: vec![empty; local.stats_len()],
        })
        .collect();
    for step in 0..spec.world() {
        for (rank, acc) in acc.iter_mut().enumerate() {
            let src = spec.source(rank, step);
            for (qi, a) in spec.chunks(rank).into_iter().enumerate() {
                let q = half(x[rank].q, d.batch, d.chunk, d.dq_width, qi);
                for (ki, b) in spec.chunks(src).into_iter().enumerate() {
                    let Some(block) = spec.block_spec(spec.block(a, b)) else {
                        continue;
                    };
                    let k = half(x[src].k, d.batch, d.chunk, d.dk_width, ki);
                    let v = half(x[src].v, d.batch, d.chunk, d.dv_width, ki);
                    let part = crate::forward_f64(
                        block,
                        Inputs {
                            q: &q,
                            k: &k,
                            v: &v,
                            bias: None,
                        },
                    )?;
                    merge(acc, &part, &d, spec.merge(), qi);
                }
            }
        }
    }
    Ok(acc)
}

/// Backward of a context-parallel call, given each rank's shard `x[r]`, its forward `fwd[r]` (o and
/// LSE from [`forward_f64`]) and its dO `d_o[r]` (`[B, 2C, Hq, Dv]`); returns each rank's dq, dk, dv.
pub fn backward_f64(
    spec: &RingSpec,
    x: &[Inputs<'_, f64>],
    fwd: &[Forward<f64, f64>],
    d_o: &[&[f64]],
) -> Result<Vec<Gradients<f64>>> {
    check_ranks(spec, Pass::Backward, "inputs", x.len())?;
    check_ranks(spec, Pass::Backward, "forward results", fwd.len())?;
    check_ranks(spec, Pass::Backward, "dO", d_o.len())?;
    let local = spec.local();
    for r in 0..spec.world() {
        check_shard(spec, Pass::Backward, r, &x[r])?;
        local.check_len(Pass::Backward, "o", fwd[r].o.len(), local.o_len())?;
        local.check_len(Pass::Backward, "stats", fwd[r].stats.len(), local.stats_len())?;
        local.check_len(Pass::Backward, "dO", d_o[r].len(), local.o_len())?;
    }
    let d = Dims::of(spec);
    let bh = d.batch * d.heads_q;
    let mut grads: Vec<Gradients<f64>> = (0..spec.world())
        .map(|_| Gradients {
            dq: vec![0.0; local.dq_len()],
            dk: vec![0.0; local.dk_len()],
            dv: vec![0.0; local.dv_len()],
            dbias: None,
        })
        .collect();
    for step in 0..spec.world() {
        for rank in 0..spec.world() {
            let src = spec.source(rank, step);
            for (qi, a) in spec.chunks(rank).into_iter().enumerate() {
                let q = half(x[rank].q, d.batch, d.chunk, d.dq_width, qi);
                let o = half(&fwd[rank].o, d.batch, d.chunk, d.o_width, qi);
                let g_o = half(d_o[rank], d.batch, d.chunk, d.o_width, qi);
                let lse = stats_half(&fwd[rank].stats, bh, d.chunk, qi);
                for (ki, b) in spec.chunks(src).into_iter().enumerate() {
                    let Some(block) = spec.block_spec(spec.block(a, b)) else {
                        continue;
                    };
                    let k = half(x[src].k, d.batch, d.chunk, d.dk_width, ki);
                    let v = half(x[src].v, d.batch, d.chunk, d.dv_width, ki);
                    let inputs = Inputs {
                        q: &q,
                        k: &k,
                        v: &v,
                        bias: None,
                    };
                    let g = crate::backward_f64(block, inputs, &o, &g_o, &lse)?;
                    add_half(&mut grads[rank].dq, &g.dq, d.batch, d.chunk, d.dq_width, qi);
                    add_half(&mut grads[src].dk, &g.dk, d.batch, d.chunk, d.dk_width, ki);
                    add_half(&mut grads[src].dv, &g.dv, d.batch, d.chunk, d.dv_width, ki);
                }
            }
        }
    }
    Ok(grads)
}
