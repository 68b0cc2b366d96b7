//! The entry points: [`attention`] with [`AttnOptions`], and the candle-flash-attn drop-ins.
//!
//! Each call is checked once here: the tensors' ranks, shapes, dtypes and devices, plus the
//! options, become one [`attn_core::AttnProblem`] whose strides are read from the tensors' layouts
//! (a transposed `(b, seq, heads, d)` view keeps its strides; only a tensor whose last dim is not
//! contiguous is copied). `validate` turns it into the [`attn_core::AttnSpec`] the ops run.
//!
//! Shapes (`Layout::Bnhd`, the default; `Layout::Bhnd` swaps seq and heads):
//! q `[B, Nq, Hq, D]`, k `[B, Nk, Hkv, D]`, v `[B, Nk, Hkv, Dv]` → o `[B, Nq, Hq, Dv]`, with
//! `Hq` a multiple of `Hkv` (GQA: query head `h` reads kv head `h / (Hq/Hkv)`); packed varlen
//! q `[total_q, Hq, D]`, k and v `[total_k, Hkv, ·]` → o `[total_q, Hq, Dv]`; bias
//! `[B|1, Hq|1, Nq, Nk]`, differentiable.

use crate::error::{describe, storage_dtype, to_candle};
use crate::op::Call;
use attn_core::{
    shape_str, AttnError, AttnProblem, Causal, DType, Family, InputStrides, Layout, Op, Pass, SeqLengths,
    SoftmaxParams, Strides, Window, MAX_HEAD_DIM,
};
use candle_core::{Result, Tensor};
use std::sync::Arc;

/// Everything about a call except the tensors q, k, v: the family with its parameters, the causal
/// mask and its alignment, a sliding window, key lengths (padding or packed varlen), an additive
/// bias, and the layout of the outer dims. GQA follows from the shapes of q and k.
/// [`AttnOptions::new`] sets the defaults stated on each field; the `with_*` methods change one.
///
/// ```
/// use attn_candle::{attention, AttnOptions, Causal, Family};
/// use candle_core::{Device, Tensor};
/// let q = Tensor::randn(0f32, 1.0, (1, 6, 4, 16), &Device::Cpu)?;
/// let kv = Tensor::randn(0f32, 1.0, (1, 6, 1, 16), &Device::Cpu)?; // one kv head: MQA
/// let opts = AttnOptions::new(Family::cosine_sim())
///     .with_causal(Causal::TopLeft)
///     .with_window(Some(2), Some(0));
/// assert_eq!(attention(&q, &kv, &kv, &opts)?.dims(), &[1, 6, 4, 16]);
/// # Ok::<(), candle_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct AttnOptions {
    /// The family and its parameters.
    pub family: Family,
    /// Causal mask and its alignment when q and k differ in length (default [`Causal::None`]).
    pub causal: Causal,
    /// Sliding window (default `None`); softmax-like families only.
    pub window: Option<Window>,
    /// Dense (the default), key padding, or [`SeqLengths::Varlen`]: q, k, v packed
    /// `[total, heads, dim]`.
    pub lengths: SeqLengths,
    /// `[B|1, Hq|1, Nq, Nk]`, same dtype and device as q; it receives a gradient. Default `None`;
    /// softmax-like families only.
    pub bias: Option<Tensor>,
    /// Order of the outer dims (default [`Layout::Bnhd`], `(b, seq, heads, d)`).
    pub layout: Layout,
    /// A backward with the same bits on every run ([`AttnProblem::deterministic`]); off by default,
    /// where attn-cuda's Hopper backward may sum dQ with atomics, as FlashAttention does.
    pub deterministic: bool,
}

impl AttnOptions {
    /// Unmasked dense attention of `family` in `(b, seq, heads, d)` layout.
    pub fn new(family: Family) -> Self {
        AttnOptions {
            family,
            causal: Causal::None,
            window: None,
            lengths: SeqLengths::Dense,
            bias: None,
            layout: Layout::Bnhd,
            deterministic: false,
        }
    }
    /// Set [`AttnOptions::causal`].
    pub fn with_causal(mut self, causal: Causal) -> Self {
        self.causal = causal;
        self
    }
    /// Keys `diag − left ..= diag + right` (softmax-like families; `None` leaves a side open).
    pub fn with_window(mut self, left: Option<usize>, right: Option<usize>) -> Self {
        self.window = Some(Window { left, right });
        self
    }
    /// Batch entry `b` attends to its first `key_lens[b]` keys.
    pub fn with_key_lens(mut self, key_lens: Vec<usize>) -> Self {
        self.lengths = SeqLengths::KeyPadding(key_lens);
        self
    }
    /// Packed sequences: sequence `b` owns query rows `cu_seqlens_q[b]..cu_seqlens_q[b+1]` and key
    /// rows `cu_seqlens_k[b]..cu_seqlens_k[b+1]`.
    pub fn with_varlen(mut self, cu_seqlens_q: Vec<usize>, cu_seqlens_k: Vec<usize>) -> Self {
        self.lengths = SeqLengths::Varlen {
            cu_seqlens_q,
            cu_seqlens_k,
        };
        self
    }
    /// An additive, differentiable bias `[B|1, Hq|1, Nq, Nk]` (1 = broadcast).
    pub fn with_bias(mut self, bias: Tensor) -> Self {
        self.bias = Some(bias);
        self
    }
    /// Set [`AttnOptions::layout`].
    pub fn with_layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }
    /// See [`AttnOptions::deterministic`].
    pub fn with_deterministic(mut self, deterministic: bool) -> Self {
        self.deterministic = deterministic;
        self
    }
}

/// Attention of `q` over `k`, `v` as `opts` describe it; differentiable in q, k, v and the bias.
///
/// Errors (as candle errors naming the op and the shapes): ranks, shapes, dtypes (f32, f16, bf16,
/// all equal) or devices that do not agree, and options the family does not take (a window or a
/// bias with Taylor attention).
///
/// Messages use the caller's words: the tensors `q`, `k`, `v`, `bias` with their shapes, and the
/// options' names (`key_lens`, `cu_seqlens_q`, `scale`, `window`, ...). Cosine-sim with q
/// `[1, 4, 3, 8]` and k `[1, 4, 2, 8]`, for example, fails with
/// ```text
/// cosine_sim attention: invalid `k`: q has 3 heads, not a multiple of k's 2 heads (q [1, 4, 3, 8], k [1, 4, 2, 8])
/// ```
/// The candle error's message is the [`AttnError`]'s (candle appends a backtrace when
/// `RUST_BACKTRACE` is set).
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, opts: &AttnOptions) -> Result<Tensor> {
    Ok(attend(q, k, v, opts, &ATTENTION)?.0)
}

/// [`attention`], also returning the statistics the forward saved (detached, f32): the
/// log-sum-exp per row for the softmax-like families (−∞ for a row with no allowed key), the
/// denominator `Σ_j f(s_ij)` for Taylor; `[B, Hq, Nq]`, or `[Hq, total_q]` when packed.
pub fn attention_with_stats(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: &AttnOptions,
) -> Result<(Tensor, Tensor)> {
    let (o, call) = attend(q, k, v, opts, &ATTENTION)?;
    Ok((o, call.stats()?))
}

/// Softmax attention with candle-flash-attn's signature: q `(b, seq_q, heads_q, d)`, k and v
/// `(b, seq_k, heads_kv, d)` (any strides with a contiguous last dim), `causal` aligned
/// bottom-right (query `i` sees keys `j ≤ i + seq_k − seq_q`), GQA when `heads_q > heads_kv`.
/// Unlike candle-flash-attn it has a backward, and it also takes f32. Errors name `q`, `k`, `v` and
/// `softmax_scale`.
pub fn flash_attn(q: &Tensor, k: &Tensor, v: &Tensor, softmax_scale: f32, causal: bool) -> Result<Tensor> {
    Ok(attend(q, k, v, &flash_options(softmax_scale, causal), &FLASH)?.0)
}

/// Packed variable-length softmax attention with candle-flash-attn's signature: q
/// `(total_q, heads_q, d)`, k and v `(total_k, heads_kv, d)`, `seqlens_q` / `seqlens_k` the
/// cumulative offsets (`[batch + 1]`, any integer dtype, starting at 0), `max_seqlen_*` bounds on
/// each sequence's length; `causal` aligned bottom-right per sequence. Errors name the arguments
/// as this signature does.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let op = Op::new(attn_core::FamilyKind::Softmax, Pass::Spec);
    let cu_q = cu_seqlens(op, "seqlens_q", seqlens_q)?;
    let cu_k = cu_seqlens(op, "seqlens_k", seqlens_k)?;
    let opts = flash_options(softmax_scale, causal).with_varlen(cu_q, cu_k);
    let names = ArgNames {
        max_seqlens: Some((max_seqlen_q, max_seqlen_k)),
        ..FLASH
    };
    Ok(attend(q, k, v, &opts, &names)?.0)
}

/// What an entry point calls the arguments that [`AttnProblem::validate`] names, so that its errors
/// speak of what the caller passed.
#[derive(Clone, Copy)]
struct ArgNames {
    /// The softmax scale: `scale` (a field of [`SoftmaxParams`]) or `softmax_scale`.
    scale: &'static str,
    /// The packed offsets: `cu_seqlens_q`/`_k` ([`AttnOptions::with_varlen`]) or `seqlens_q`/`_k`.
    cu_q: &'static str,
    cu_k: &'static str,
    /// `max_seqlen_q`/`_k` where the caller gave them (`flash_attn_varlen`); otherwise the
    /// longest packed sequence bounds the others.
    max_seqlens: Option<(usize, usize)>,
}

const ATTENTION: ArgNames = ArgNames {
    scale: "scale",
    cu_q: "cu_seqlens_q",
    cu_k: "cu_seqlens_k",
    max_seqlens: None,
};

const FLASH: ArgNames = ArgNames {
    scale: "softmax_scale",
    cu_q: "seqlens_q",
    cu_k: "seqlens_k",
    max_seqlens: None,
};

fn flash_options(softmax_scale: f32, causal: bool) -> AttnOptions {
    let family = Family::Softmax(SoftmaxParams {
        scale: Some(softmax_scale),
        softcap: None,
    });
    let causal = if causal { Causal::BottomRight } else { Causal::None };
    AttnOptions::new(family).with_causal(causal)
}

/// Host copy of a `[batch + 1]` integer tensor of cumulative sequence offsets.
fn cu_seqlens(op: Op, arg: &'static str, t: &Tensor) -> Result<Vec<usize>> {
    if t.rank() != 1 || !t.dtype().is_int() {
        return Err(to_candle(AttnError::ShapeMismatch {
            op,
            what: arg.into(),
            expected: "a rank-1 integer tensor [batch + 1]".into(),
            got: describe(arg, t),
        }));
    }
    let values = t.to_dtype(candle_core::DType::I64)?.to_vec1::<i64>()?;
    values
        .iter()
        .map(|&x| {
            usize::try_from(x).map_err(|_| {
                to_candle(AttnError::InvalidArgument {
                    op,
                    arg,
                    reason: format!("negative offset {x} in {values:?}"),
                })
            })
        })
        .collect()
}

/// Check, build the spec, and run the call; errors in the words of `names`.
fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: &AttnOptions,
    names: &ArgNames,
) -> Result<(Tensor, Arc<Call>)> {
    let (q, k, v) = (
        for_kernels(last_dim_contiguous(q)?)?,
        for_kernels(last_dim_contiguous(k)?)?,
        for_kernels(last_dim_contiguous(v)?)?,
    );
    let bias = opts.bias.as_ref().map(Tensor::contiguous).transpose()?;
    let p = problem(&q, &k, &v, bias.as_ref(), opts, names).map_err(to_candle)?;
    let spec = p
        .validate()
        .map_err(|e| to_candle(in_callers_terms(e, &p, [&q, &k, &v], names)))?;
    Call::run(spec, &q, &k, &v, bias.as_ref())
}

/// A validation error of `p` restated in the caller's words: the fields of [`AttnProblem`]
/// (`heads_q`, `seq_k`, `head_dim`, ...) become the tensors they were read from, with their shapes,
/// and the options take the entry point's names. Errors already in those words pass unchanged.
fn in_callers_terms(e: AttnError, p: &AttnProblem, [q, k, v]: [&Tensor; 3], names: &ArgNames) -> AttnError {
    let (op, arg, reason) = match e {
        AttnError::InvalidArgument { op, arg, reason } => (op, arg, reason),
        AttnError::ShapeMismatch { op, what, .. } if what == "key_lens" => {
            let given = match &p.lengths {
                SeqLengths::KeyPadding(lens) => lens.len(),
                _ => 0,
            };
            return AttnError::ShapeMismatch {
                op,
                what,
                expected: format!(
                    "{} lengths, one per batch entry of q {}",
                    p.batch,
                    shape_str(q.dims())
                ),
                got: format!("{given}"),
            };
        }
        other => return other,
    };
    let invalid = |arg: &'static str, reason: String| AttnError::InvalidArgument { op, arg, reason };
    let (cu_seqlens_q, cu_seqlens_k) = match &p.lengths {
        SeqLengths::Varlen {
            cu_seqlens_q,
            cu_seqlens_k,
        } => (Some(cu_seqlens_q), Some(cu_seqlens_k)),
        _ => (None, None),
    };
    // A zero sequence length of a packed batch is a zero maximum: every sequence empty, or a zero
    // `max_seqlen_*` argument.
    let empty_packed = |cu_name: &'static str, max_name: &'static str| match names.max_seqlens {
        Some(_) => invalid(max_name, "must be at least 1".into()),
        None => invalid(cu_name, "every packed sequence is empty".into()),
    };
    match arg {
        "seq_q" if cu_seqlens_q.is_some() => empty_packed(names.cu_q, "max_seqlen_q"),
        "seq_k" if cu_seqlens_k.is_some() => empty_packed(names.cu_k, "max_seqlen_k"),
        "batch" | "seq_q" | "heads_q" => invalid("q", format!("{} has an empty dimension", describe("q", q))),
        "seq_k" => invalid("k", format!("{} has an empty dimension", describe("k", k))),
        "heads_kv" if p.heads_kv == 0 => invalid("k", format!("{} has no heads", describe("k", k))),
        "heads_kv" => invalid(
            "k",
            format!(
                "q has {} heads, not a multiple of k's {} heads (q {}, k {})",
                p.heads_q,
                p.heads_kv,
                shape_str(q.dims()),
                shape_str(k.dims())
            ),
        ),
        "head_dim" => invalid(
            "q",
            format!(
                "{}: head dim {} is outside 1..={MAX_HEAD_DIM}",
                describe("q", q),
                p.head_dim
            ),
        ),
        "head_dim_v" => invalid(
            "v",
            format!(
                "{}: head dim {} is outside 1..={MAX_HEAD_DIM}",
                describe("v", v),
                p.head_dim_v
            ),
        ),
        "key_lens" => match &p.lengths {
            SeqLengths::KeyPadding(lens) => match lens.iter().enumerate().find(|(_, &l)| l > p.seq_k) {
                Some((b, l)) => invalid(
                    "key_lens",
                    format!(
                        "key_lens[{b}] = {l} exceeds the {} keys of {}",
                        p.seq_k,
                        describe("k", k)
                    ),
                ),
                None => invalid(arg, reason),
            },
            _ => invalid(arg, reason),
        },
        "cu_seqlens_q" | "cu_seqlens_k" => {
            let (name, cu, max, max_name) = if arg == "cu_seqlens_q" {
                (names.cu_q, cu_seqlens_q, p.seq_q, "max_seqlen_q")
            } else {
                (names.cu_k, cu_seqlens_k, p.seq_k, "max_seqlen_k")
            };
            let too_long = cu.and_then(|cu| {
                cu.windows(2)
                    .enumerate()
                    .find(|(_, w)| w[1] > w[0] && w[1] - w[0] > max)
                    .map(|(b, w)| (b, w[1] - w[0]))
            });
            match (too_long, names.max_seqlens) {
                (Some((b, len)), Some(_)) => invalid(
                    name,
                    format!("sequence {b} has length {len}, more than {max_name} = {max}"),
                ),
                _ => invalid(name, reason),
            }
        }
        "scale" => invalid(names.scale, reason),
        _ => invalid(arg, reason),
    }
}

/// The tensor itself when its last dim is contiguous (any other strides are kept), else a copy.
fn last_dim_contiguous(t: &Tensor) -> Result<Tensor> {
    match (t.dims().last(), t.stride().last()) {
        (Some(&d), Some(&s)) if d > 1 && s != 1 => t.contiguous(),
        _ => Ok(t.clone()),
    }
}

/// attn-cuda's f16/bf16 kernels load rows 16 bytes at a time: a CUDA view in those dtypes whose
/// start offset or outer strides are not multiples of 8 elements is copied to a dense tensor (the
/// only copy the CUDA path makes; f32 views and aligned views, transposed or not, are read in
/// place). Other tensors are returned as they are.
fn for_kernels(t: Tensor) -> Result<Tensor> {
    let half = matches!(t.dtype(), candle_core::DType::F16 | candle_core::DType::BF16);
    if !t.device().is_cuda() || !half {
        return Ok(t);
    }
    let l = t.layout();
    let outer = &l.stride()[..l.stride().len().saturating_sub(1)];
    if l.start_offset() % 8 == 0 && outer.iter().all(|s| s % 8 == 0) {
        Ok(t)
    } else {
        t.force_contiguous()
    }
}

/// Element strides of `t` in logical `(batch, seq, head, dim)` order; a packed rank-3 tensor has
/// batch stride 0 (the spec addresses packed rows through `cu_seqlens`).
pub(crate) fn strides_of(t: &Tensor, layout: Layout) -> Strides {
    let st = t.stride();
    let (batch, seq, head) = match (st, layout) {
        (&[b, n, h, _], Layout::Bnhd) | (&[b, h, n, _], Layout::Bhnd) => (b, n, h),
        (&[n, h, _], Layout::Bnhd) | (&[h, n, _], Layout::Bhnd) => (0, n, h),
        _ => (0, 0, 0),
    };
    Strides {
        batch,
        seq,
        head,
        dim: 1,
    }
}

/// The problem of a call, with the checks only the tensors allow (ranks, dtypes, devices, packed
/// row counts); [`AttnProblem::validate`] does the rest.
fn problem(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: Option<&Tensor>,
    opts: &AttnOptions,
    names: &ArgNames,
) -> std::result::Result<AttnProblem, AttnError> {
    let kind = opts.family.kind();
    let op = Op::new(kind, Pass::Spec);
    let dtype = storage_dtype(kind, "q", q)?;
    for (name, t) in [("k", k), ("v", v)].into_iter().chain(bias.map(|b| ("bias", b))) {
        if t.dtype() != q.dtype() {
            return Err(AttnError::InvalidArgument {
                op,
                arg: "dtype",
                reason: format!("{} does not match {}", describe(name, t), describe("q", q)),
            });
        }
        if !t.device().same_device(q.device()) {
            return Err(AttnError::InvalidArgument {
                op,
                arg: "device",
                reason: format!(
                    "{} is not on the device of {}",
                    describe(name, t),
                    describe("q", q)
                ),
            });
        }
    }
    let mut p = match &opts.lengths {
        SeqLengths::Varlen {
            cu_seqlens_q,
            cu_seqlens_k,
        } => varlen_problem(op, opts, dtype, [q, k, v], cu_seqlens_q, cu_seqlens_k, names)?,
        SeqLengths::Dense | SeqLengths::KeyPadding(_) => {
            let mut p =
                AttnProblem::from_shapes(opts.family, dtype, opts.layout, q.dims(), k.dims(), v.dims())?;
            p.lengths = opts.lengths.clone();
            p
        }
    };
    p.strides = Some(InputStrides {
        q: strides_of(q, opts.layout),
        k: strides_of(k, opts.layout),
        v: strides_of(v, opts.layout),
    });
    p.causal = opts.causal;
    p.window = opts.window;
    p.deterministic = opts.deterministic;
    if let Some(b) = bias {
        match *b.dims() {
            [bb, bh, nq, nk] if (nq, nk) == (p.seq_q, p.seq_k) => {
                p.bias = Some(attn_core::BiasShape { batch: bb, heads: bh })
            }
            _ => {
                return Err(AttnError::ShapeMismatch {
                    op,
                    what: "bias".into(),
                    expected: format!("[{}|1, {}|1, {}, {}]", p.batch, p.heads_q, p.seq_q, p.seq_k),
                    got: shape_str(b.dims()),
                })
            }
        }
    }
    Ok(p)
}

/// A packed problem from rank-3 q, k, v and the cumulative offsets.
fn varlen_problem(
    op: Op,
    opts: &AttnOptions,
    dtype: DType,
    [q, k, v]: [&Tensor; 3],
    cu_q: &[usize],
    cu_k: &[usize],
    names: &ArgNames,
) -> std::result::Result<AttnProblem, AttnError> {
    let all = || {
        format!(
            "q {}, k {}, v {}",
            shape_str(q.dims()),
            shape_str(k.dims()),
            shape_str(v.dims())
        )
    };
    let dims = |what: &str, t: &Tensor| match (t.dims(), opts.layout) {
        (&[n, h, d], Layout::Bnhd) | (&[h, n, d], Layout::Bhnd) => Ok((n, h, d)),
        _ => Err(AttnError::ShapeMismatch {
            op,
            what: what.into(),
            expected: format!(
                "a rank-3 packed tensor in {:?} layout ([total, heads, dim] for Bnhd)",
                opts.layout
            ),
            got: shape_str(t.dims()),
        }),
    };
    let (tq, hq, dq) = dims("q", q)?;
    let (tk, hk, dk) = dims("k", k)?;
    let (tv, hv, dv) = dims("v", v)?;
    if dk != dq {
        return Err(AttnError::ShapeMismatch {
            op,
            what: "k".into(),
            expected: format!("k head dim equal to q's ({dq})"),
            got: all(),
        });
    }
    if (tv, hv) != (tk, hk) {
        return Err(AttnError::ShapeMismatch {
            op,
            what: "v".into(),
            expected: format!("v with k's rows and heads ({tk}, {hk})"),
            got: all(),
        });
    }
    if cu_q.len() < 2 || cu_k.len() != cu_q.len() {
        return Err(AttnError::ShapeMismatch {
            op,
            what: format!("{} and {}", names.cu_q, names.cu_k),
            expected: "one length, batch + 1 ≥ 2".into(),
            got: format!("{} and {}", shape_str(&[cu_q.len()]), shape_str(&[cu_k.len()])),
        });
    }
    for (what, cu, cu_name, total) in [("q", cu_q, names.cu_q, tq), ("k", cu_k, names.cu_k, tk)] {
        if cu[cu.len() - 1] != total {
            return Err(AttnError::ShapeMismatch {
                op,
                what: what.into(),
                expected: format!("{} packed rows (the last {cu_name} offset)", cu[cu.len() - 1]),
                got: all(),
            });
        }
    }
    let longest = |cu: &[usize]| {
        cu.windows(2)
            .map(|w| w[1].saturating_sub(w[0]))
            .max()
            .unwrap_or(0)
    };
    let (max_q, max_k) = names.max_seqlens.unwrap_or((longest(cu_q), longest(cu_k)));
    Ok(
        AttnProblem::new(opts.family, dtype, cu_q.len() - 1, hq, hk, max_q, max_k, dq)
            .with_head_dim_v(dv)
            .with_layout(opts.layout)
            .with_varlen(cu_q.to_vec(), cu_k.to_vec()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    #[test]
    fn transposed_view_keeps_its_strides_in_the_spec() -> Result<()> {
        // A [B, H, N, D] buffer seen as (b, seq, heads, d): strides (H·N·D, D, N·D, 1), not copied.
        let base = Tensor::zeros((2, 3, 5, 8), candle_core::DType::F32, &Device::Cpu)?;
        let view = base.transpose(1, 2)?;
        assert!(!view.is_contiguous());
        let same = last_dim_contiguous(&view)?;
        assert_eq!(
            same.id(),
            view.id(),
            "a view with a contiguous last dim must not be copied"
        );
        let s = strides_of(&view, Layout::Bnhd);
        assert_eq!((s.batch, s.seq, s.head, s.dim), (120, 8, 40, 1));
        let p = problem(
            &view,
            &view,
            &view,
            None,
            &AttnOptions::new(Family::softmax()),
            &ATTENTION,
        )
        .map_err(to_candle)?
        .validate()
        .map_err(to_candle)?;
        assert_eq!(p.q_strides(), s);
        assert_eq!(p.q_offset(1, 4, 2), 120 + 4 * 8 + 2 * 40);
        Ok(())
    }

    #[test]
    fn deterministic_reaches_the_spec_dense_and_packed() -> Result<()> {
        let dense = Tensor::zeros((2, 5, 3, 8), candle_core::DType::F32, &Device::Cpu)?;
        let packed = Tensor::zeros((7, 3, 8), candle_core::DType::F32, &Device::Cpu)?;
        for deterministic in [false, true] {
            let opts = AttnOptions::new(Family::softmax()).with_deterministic(deterministic);
            let varlen = opts.clone().with_varlen(vec![0, 3, 7], vec![0, 3, 7]);
            for (x, o) in [(&dense, &opts), (&packed, &varlen)] {
                let p = problem(x, x, x, None, o, &ATTENTION).map_err(to_candle)?;
                assert_eq!(p.validate().map_err(to_candle)?.deterministic(), deterministic);
            }
        }
        Ok(())
    }

    #[test]
    fn a_last_dim_with_stride_is_copied_to_contiguous() -> Result<()> {
        let base = Tensor::zeros((2, 8, 3, 5), candle_core::DType::F32, &Device::Cpu)?;
        let view = base.transpose(1, 3)?;
        let fixed = last_dim_contiguous(&view)?;
        assert_eq!(fixed.stride().last(), Some(&1));
        assert!(fixed.is_contiguous());
        Ok(())
    }
}
