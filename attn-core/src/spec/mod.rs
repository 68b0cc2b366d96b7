//! The call spec: what a user asks for ([`AttnProblem`]) and its checked form ([`AttnSpec`]).
//!
//! One [`AttnProblem::validate`] turns user input into an [`AttnSpec`]; the CPU reference, the
//! kernels and the Candle ops accept only the checked form and never re-validate. The spec also owns
//! the index arithmetic (strides, packed varlen offsets, statistics and bias layouts) and the mask
//! (`key_range`), so every backend agrees on what a call means.
//!
//! Shapes, for one call (`[B, N, H, D]` layout shown; `[B, H, N, D]` is the same with strides):
//! - q `[B, Nq, Hq, D]`, k `[B, Nk, Hkv, D]`, v `[B, Nk, Hkv, Dv]`, o and dO `[B, Nq, Hq, Dv]`;
//! - packed varlen: q `[total_q, Hq, D]`, k `[total_k, Hkv, D]` with `cu_seqlens` offsets;
//! - statistics (LSE or Taylor denominators, f32): `[B, Hq, Nq]`, or `[Hq, total_q]` when packed;
//! - bias and dbias: `[B|1, Hq|1, Nq, Nk]`, contiguous.

use crate::error::{shape_str, AttnError, FamilyKind, Op, Pass, Result};
use crate::family::{Family, FamilySpec, HypScore, TaylorOrder, DEFAULT_L2_EPS, SQ_LORENTZ_CURVATURE};
use crate::DType;
use std::ops::Range;

mod validate;

/// Largest head dim the spec accepts. Backends may support fewer (they say so with `Unsupported`).
pub const MAX_HEAD_DIM: usize = 256;

/// Largest size, row count, sequence offset or window bound a spec may hold: the kernels' parameters
/// carry them as 32-bit `int` (attn-cuda's `AttnParams`; strides and element offsets are 64-bit).
pub(crate) const MAX_INDEX: usize = i32::MAX as usize;

/// Order of the three outer dims of q, k, v, o.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Layout {
    /// `[B, N, H, D]`: candle and FlashAttention.
    #[default]
    Bnhd,
    /// `[B, H, N, D]`: PyTorch SDPA.
    Bhnd,
}

/// Element strides of a 4-d tensor in logical `(batch, seq, head, dim)` order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Strides {
    /// Elements between batch entries (0 for a packed varlen batch, whose rows are indexed by `seq`).
    pub batch: usize,
    /// Elements between tokens.
    pub seq: usize,
    /// Elements between heads.
    pub head: usize,
    /// Must be 1: the last dim is contiguous.
    pub dim: usize,
}

impl Strides {
    /// Strides of a contiguous tensor with `seq` tokens per batch, `heads` heads and `dim` features.
    /// The products saturate at `usize::MAX` instead of wrapping, so sizes whose strides do not fit
    /// give strides that [`AttnProblem::validate`] rejects as [`AttnError::TooLarge`](crate::AttnError::TooLarge).
    ///
    /// ```
    /// use attn_core::{Layout, Strides};
    /// let s = Strides::contiguous(Layout::Bhnd, 10, 4, 8);
    /// assert_eq!((s.batch, s.seq, s.head, s.dim), (320, 8, 80, 1));
    /// ```
    pub fn contiguous(layout: Layout, seq: usize, heads: usize, dim: usize) -> Self {
        match layout {
            Layout::Bnhd => Strides {
                batch: seq.saturating_mul(heads).saturating_mul(dim),
                seq: heads.saturating_mul(dim),
                head: dim,
                dim: 1,
            },
            Layout::Bhnd => Strides {
                batch: heads.saturating_mul(seq).saturating_mul(dim),
                seq: dim,
                head: seq.saturating_mul(dim),
                dim: 1,
            },
        }
    }
}

/// Causal mask and its alignment when `Nq ≠ Nk`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Causal {
    /// No causal mask (the default): every key is allowed, up to the window and the key lengths.
    #[default]
    None,
    /// `j ≤ i` (PyTorch `is_causal`).
    TopLeft,
    /// `j ≤ i + Nk − Nq` (FlashAttention, KV cache).
    BottomRight,
}

/// Sliding window around the diagonal: key `j` is allowed for query `i` when
/// `diag − left ≤ j ≤ diag + right`, where `diag = i` for [`Causal::TopLeft`] and `i + Nk − Nq`
/// otherwise (FlashAttention's convention). `None` leaves that side unbounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Window {
    /// Keys allowed before the diagonal; `None` (the default): all of them.
    pub left: Option<usize>,
    /// Keys allowed after the diagonal; `None` (the default): all of them.
    pub right: Option<usize>,
}

/// Which keys (and, packed, which queries) exist per batch entry.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum SeqLengths {
    /// Every batch entry has `seq_q` queries and `seq_k` keys.
    #[default]
    Dense,
    /// Batch entry `b` has `seq_q` queries and its first `key_lens[b]` keys valid.
    KeyPadding(Vec<usize>),
    /// Packed variable-length batch: sequence `b` owns query rows `cu_seqlens_q[b]..cu_seqlens_q[b+1]`
    /// and key rows `cu_seqlens_k[b]..cu_seqlens_k[b+1]`; `seq_q`/`seq_k` are the maxima.
    Varlen {
        /// `B + 1` non-decreasing query row offsets, starting at 0.
        cu_seqlens_q: Vec<usize>,
        /// `B + 1` non-decreasing key row offsets, starting at 0.
        cu_seqlens_k: Vec<usize>,
    },
}

/// An additive bias of shape `[batch, heads, Nq, Nk]` (contiguous), with `batch ∈ {1, B}` and
/// `heads ∈ {1, Hq}` (1 = broadcast). Its gradient has the same shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BiasShape {
    /// 1 (broadcast over the batch) or B.
    pub batch: usize,
    /// 1 (broadcast over the heads) or Hq.
    pub heads: usize,
}

/// Explicit strides for strided input views (e.g. transposes); outputs are always contiguous.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InputStrides {
    /// Strides of q.
    pub q: Strides,
    /// Strides of k.
    pub k: Strides,
    /// Strides of v.
    pub v: Strides,
}

/// One attention call as the user describes it. Fields are public; [`AttnProblem::validate`] checks
/// them all at once. [`AttnProblem::new`] sets the defaults stated on each field; the `with_*`
/// methods change one field each.
#[derive(Clone, Debug, PartialEq)]
pub struct AttnProblem {
    /// The family and its parameters.
    pub family: Family,
    /// Storage dtype of q, k, v, o and the gradients.
    pub dtype: DType,
    /// Batch entries (B), ≥ 1.
    pub batch: usize,
    /// Query heads (Hq), a multiple of `heads_kv`.
    pub heads_q: usize,
    /// Key/value heads (Hkv): `Hkv = Hq` is multi-head, `1` multi-query, otherwise grouped-query
    /// attention, where query head `h` reads kv head `h / (Hq/Hkv)`.
    pub heads_kv: usize,
    /// Queries per batch entry (Nq); the maximum sequence length when packed.
    pub seq_q: usize,
    /// Keys per batch entry (Nk); the maximum sequence length when packed.
    pub seq_k: usize,
    /// Head dim of q and k (D), 1..=[`MAX_HEAD_DIM`].
    pub head_dim: usize,
    /// Head dim of v and o (Dv), 1..=[`MAX_HEAD_DIM`]; `new` sets it to `head_dim`.
    pub head_dim_v: usize,
    /// Order of the outer dims (default [`Layout::Bnhd`]).
    pub layout: Layout,
    /// `None` (the default): q, k, v are contiguous in `layout`.
    pub strides: Option<InputStrides>,
    /// Causal mask and alignment (default [`Causal::None`]).
    pub causal: Causal,
    /// Sliding window (default `None`: no window); softmax-like families only.
    pub window: Option<Window>,
    /// Key padding or a packed varlen batch (default [`SeqLengths::Dense`]).
    pub lengths: SeqLengths,
    /// Shape of an additive bias (default `None`: no bias); softmax-like families only.
    pub bias: Option<BiasShape>,
    /// A backward whose results are the same bits on every run. Off by default: a backend may
    /// then sum gradient contributions in whatever order its threads finish (attn-cuda's fused
    /// Hopper backward, its default on Hopper for most f16/bf16 calls at D = 64 and 128, reduces dQ
    /// with f32 atomics), as FlashAttention and PyTorch's SDPA do.
    pub deterministic: bool,
}

impl AttnProblem {
    /// A dense, unmasked problem: `batch` entries of `seq_q` queries in `heads_q` heads and `seq_k`
    /// keys and values in `heads_kv` heads, head dim `head_dim` for q, k and v. So q is
    /// `[batch, seq_q, heads_q, head_dim]` and k and v are `[batch, seq_k, heads_kv, head_dim]`
    /// ([`Layout::Bnhd`]); no mask, no bias, not deterministic.
    ///
    /// ```
    /// use attn_core::{AttnProblem, DType, Family};
    /// // B = 2, Hq = 8, Hkv = 2, Nq = 16, Nk = 32, D = 64.
    /// let p = AttnProblem::new(Family::softmax(), DType::F16, 2, 8, 2, 16, 32, 64);
    /// assert_eq!(p.validate()?.q_shape(), [2, 16, 8, 64]);
    /// # Ok::<(), attn_core::AttnError>(())
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        family: Family,
        dtype: DType,
        batch: usize,
        heads_q: usize,
        heads_kv: usize,
        seq_q: usize,
        seq_k: usize,
        head_dim: usize,
    ) -> Self {
        AttnProblem {
            family,
            dtype,
            batch,
            heads_q,
            heads_kv,
            seq_q,
            seq_k,
            head_dim,
            head_dim_v: head_dim,
            layout: Layout::Bnhd,
            strides: None,
            causal: Causal::None,
            window: None,
            lengths: SeqLengths::Dense,
            bias: None,
            deterministic: false,
        }
    }

    /// Build a dense problem from the 4-d shapes of q, k and v in `layout`, checking that they agree:
    /// the same batch, k's head dim equal to q's, v with k's sequence length and heads. A
    /// disagreement is a `ShapeMismatch` naming `q`, `k`, `v` or `batch` with the three shapes.
    pub fn from_shapes(
        family: Family,
        dtype: DType,
        layout: Layout,
        q: &[usize],
        k: &[usize],
        v: &[usize],
    ) -> Result<Self> {
        let op = Op::new(family.kind(), Pass::Spec);
        let dims = |what: &str, s: &[usize]| -> Result<(usize, usize, usize, usize)> {
            match (s, layout) {
                (&[b, n, h, d], Layout::Bnhd) | (&[b, h, n, d], Layout::Bhnd) => Ok((b, n, h, d)),
                _ => Err(AttnError::ShapeMismatch {
                    op,
                    what: what.to_string(),
                    expected: match layout {
                        Layout::Bnhd => "a rank-4 tensor [batch, seq, heads, dim]".into(),
                        Layout::Bhnd => "a rank-4 tensor [batch, heads, seq, dim] (Layout::Bhnd)".into(),
                    },
                    got: shape_str(s),
                }),
            }
        };
        let (bq, nq, hq, dq) = dims("q", q)?;
        let (bk, nk, hk, dk) = dims("k", k)?;
        let (bv, nv, hv, dv) = dims("v", v)?;
        let mismatch = |what: &str, expected: String| AttnError::ShapeMismatch {
            op,
            what: what.to_string(),
            expected,
            got: format!("q {}, k {}, v {}", shape_str(q), shape_str(k), shape_str(v)),
        };
        if bk != bq {
            return Err(mismatch("k", format!("k with q's batch ({bq})")));
        }
        if bv != bq {
            return Err(mismatch("v", format!("v with q's batch ({bq})")));
        }
        if dk != dq {
            return Err(mismatch("k", format!("k head dim equal to q's ({dq})")));
        }
        if nv != nk || hv != hk {
            return Err(mismatch(
                "v",
                format!("v with k's sequence length and heads ({nk}, {hk})"),
            ));
        }
        let mut p = AttnProblem::new(family, dtype, bq, hq, hk, nq, nk, dq);
        p.head_dim_v = dv;
        p.layout = layout;
        Ok(p)
    }

    /// Set [`AttnProblem::causal`].
    pub fn with_causal(mut self, causal: Causal) -> Self {
        self.causal = causal;
        self
    }
    /// Set a sliding [`Window`] of `left` keys before and `right` keys after the diagonal.
    pub fn with_window(mut self, left: Option<usize>, right: Option<usize>) -> Self {
        self.window = Some(Window { left, right });
        self
    }
    /// Key padding: batch entry `b` has its first `key_lens[b]` keys valid (`B` lengths, each ≤ `seq_k`).
    pub fn with_key_lens(mut self, key_lens: Vec<usize>) -> Self {
        self.lengths = SeqLengths::KeyPadding(key_lens);
        self
    }
    /// A packed variable-length batch with `B + 1` offsets each ([`SeqLengths::Varlen`]).
    pub fn with_varlen(mut self, cu_seqlens_q: Vec<usize>, cu_seqlens_k: Vec<usize>) -> Self {
        self.lengths = SeqLengths::Varlen {
            cu_seqlens_q,
            cu_seqlens_k,
        };
        self
    }
    /// See [`AttnProblem::deterministic`].
    pub fn with_deterministic(mut self, deterministic: bool) -> Self {
        self.deterministic = deterministic;
        self
    }
    /// An additive bias of shape `[batch, heads, Nq, Nk]`, `batch` 1 or B, `heads` 1 or Hq.
    pub fn with_bias(mut self, batch: usize, heads: usize) -> Self {
        self.bias = Some(BiasShape { batch, heads });
        self
    }
    /// Set the head dim of v and o (Dv).
    pub fn with_head_dim_v(mut self, head_dim_v: usize) -> Self {
        self.head_dim_v = head_dim_v;
        self
    }
    /// Set [`AttnProblem::layout`].
    pub fn with_layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }
    /// Strided input views of q, k and v (each with last-dim stride 1).
    pub fn with_strides(mut self, strides: InputStrides) -> Self {
        self.strides = Some(strides);
        self
    }
}

/// Query and key counts of one batch entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqLens {
    /// Queries.
    pub q: usize,
    /// Keys.
    pub k: usize,
}

/// A checked attention call. Construct with [`AttnProblem::validate`].
#[derive(Clone, Debug, PartialEq)]
pub struct AttnSpec {
    family: FamilySpec,
    dtype: DType,
    batch: usize,
    heads_q: usize,
    heads_kv: usize,
    seq_q: usize,
    seq_k: usize,
    head_dim: usize,
    head_dim_v: usize,
    layout: Layout,
    total_q: usize,
    total_k: usize,
    q: Strides,
    k: Strides,
    v: Strides,
    o: Strides,
    dq: Strides,
    dk: Strides,
    dv: Strides,
    lens: Lens,
    causal: Causal,
    window: Option<Window>,
    lengths: SeqLengths,
    bias: Option<BiasShape>,
    deterministic: bool,
}

/// Element counts of every buffer of a call, computed (checked) once by [`AttnProblem::validate`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Lens {
    q: usize,
    k: usize,
    v: usize,
    o: usize,
    dq: usize,
    dk: usize,
    dv: usize,
    stats: usize,
    bias: usize,
}

/// Length a buffer needs to hold every element addressed by `s` (0 when there is none); `None` when
/// it overflows `usize`.
fn extent(s: Strides, batch: usize, seq: usize, heads: usize, dim: usize) -> Option<usize> {
    if batch == 0 || seq == 0 || heads == 0 || dim == 0 {
        return Some(0);
    }
    let term = |n: usize, stride: usize| (n - 1).checked_mul(stride);
    [
        term(batch, s.batch)?,
        term(seq, s.seq)?,
        term(heads, s.head)?,
        term(dim, s.dim)?,
    ]
    .into_iter()
    .try_fold(1usize, usize::checked_add)
}

impl AttnSpec {
    /// The checked family, defaults resolved.
    pub fn family(&self) -> &FamilySpec {
        &self.family
    }
    /// Storage dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Batch entries (B).
    pub fn batch(&self) -> usize {
        self.batch
    }
    /// Query heads (Hq).
    pub fn heads_q(&self) -> usize {
        self.heads_q
    }
    /// Key/value heads (Hkv).
    pub fn heads_kv(&self) -> usize {
        self.heads_kv
    }
    /// Query heads per key/value head (GQA group size).
    pub fn group(&self) -> usize {
        self.heads_q / self.heads_kv
    }
    /// The key/value head that query head `h` reads.
    pub fn kv_head(&self, h: usize) -> usize {
        h / self.group()
    }
    /// Queries per batch entry (the maximum, when packed).
    pub fn seq_q(&self) -> usize {
        self.seq_q
    }
    /// Keys per batch entry (the maximum, when packed).
    pub fn seq_k(&self) -> usize {
        self.seq_k
    }
    /// Head dim of q and k (D).
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }
    /// Head dim of v and o (Dv).
    pub fn head_dim_v(&self) -> usize {
        self.head_dim_v
    }
    /// Order of the outer dims.
    pub fn layout(&self) -> Layout {
        self.layout
    }
    /// Causal mask and alignment.
    pub fn causal(&self) -> Causal {
        self.causal
    }
    /// Sliding window, if any.
    pub fn window(&self) -> Option<Window> {
        self.window
    }
    /// Dense, key-padded or packed lengths.
    pub fn lengths(&self) -> &SeqLengths {
        &self.lengths
    }
    /// Shape of the additive bias, if any.
    pub fn bias(&self) -> Option<BiasShape> {
        self.bias
    }
    /// See [`AttnProblem::deterministic`].
    pub fn deterministic(&self) -> bool {
        self.deterministic
    }
    /// Whether the batch is packed ([`SeqLengths::Varlen`]).
    pub fn is_varlen(&self) -> bool {
        matches!(self.lengths, SeqLengths::Varlen { .. })
    }
    /// Query rows over the whole batch (`B·Nq`, or the packed total).
    pub fn total_q(&self) -> usize {
        self.total_q
    }
    /// Key rows over the whole batch (`B·Nk`, or the packed total).
    pub fn total_k(&self) -> usize {
        self.total_k
    }
    /// The op of this spec's family in `pass`, for errors.
    pub fn op(&self, pass: Pass) -> Op {
        Op::new(self.family.kind(), pass)
    }
    /// The family without its parameters.
    pub fn family_kind(&self) -> FamilyKind {
        self.family.kind()
    }
    /// Strides of q (given, or contiguous in the layout).
    pub fn q_strides(&self) -> Strides {
        self.q
    }
    /// Strides of k (given, or contiguous in the layout).
    pub fn k_strides(&self) -> Strides {
        self.k
    }
    /// Strides of v (given, or contiguous in the layout).
    pub fn v_strides(&self) -> Strides {
        self.v
    }
    /// Strides of o and dO (contiguous in the spec's layout).
    pub fn o_strides(&self) -> Strides {
        self.o
    }
    /// Strides of dq (contiguous in the spec's layout).
    pub fn dq_strides(&self) -> Strides {
        self.dq
    }
    /// Strides of dk (contiguous in the spec's layout).
    pub fn dk_strides(&self) -> Strides {
        self.dk
    }
    /// Strides of dv (contiguous in the spec's layout).
    pub fn dv_strides(&self) -> Strides {
        self.dv
    }

    /// Queries and keys of batch entry `b` (`b < batch`).
    pub fn seq_lens(&self, b: usize) -> SeqLens {
        match &self.lengths {
            SeqLengths::Dense => SeqLens {
                q: self.seq_q,
                k: self.seq_k,
            },
            SeqLengths::KeyPadding(lens) => SeqLens {
                q: self.seq_q,
                k: lens[b],
            },
            SeqLengths::Varlen {
                cu_seqlens_q,
                cu_seqlens_k,
            } => SeqLens {
                q: cu_seqlens_q[b + 1] - cu_seqlens_q[b],
                k: cu_seqlens_k[b + 1] - cu_seqlens_k[b],
            },
        }
    }

    /// Offset of the diagonal for batch entry `b`: query `i` sits on key `i + diag_offset`.
    /// 0 for top-left alignment, `Nk − Nq` (per entry) otherwise.
    pub fn diag_offset(&self, b: usize) -> i64 {
        let l = self.seq_lens(b);
        match self.causal {
            Causal::TopLeft => 0,
            Causal::None | Causal::BottomRight => l.k as i64 - l.q as i64,
        }
    }

    /// The keys query `i` of batch entry `b` may attend to: always one contiguous range, possibly
    /// empty (such a row returns zeros).
    ///
    /// ```
    /// use attn_core::{AttnProblem, Causal, DType, Family};
    /// // Nq = 2 < Nk = 4: top-left lets query 0 see key 0 only; bottom-right lets it see keys 0..=2.
    /// let p = AttnProblem::new(Family::softmax(), DType::F32, 1, 1, 1, 2, 4, 8);
    /// let tl = p.clone().with_causal(Causal::TopLeft).validate().unwrap();
    /// let br = p.with_causal(Causal::BottomRight).validate().unwrap();
    /// assert_eq!(tl.key_range(0, 0), 0..1);
    /// assert_eq!(br.key_range(0, 0), 0..3);
    /// ```
    pub fn key_range(&self, b: usize, i: usize) -> Range<usize> {
        let len_k = self.seq_lens(b).k as i64;
        let diag = i as i64 + self.diag_offset(b);
        let mut lo = 0i64;
        let mut hi = len_k;
        if self.causal != Causal::None {
            hi = hi.min(diag + 1);
        }
        if let Some(w) = self.window {
            if let Some(l) = w.left {
                lo = lo.max(diag - l as i64);
            }
            if let Some(r) = w.right {
                hi = hi.min(diag + r as i64 + 1);
            }
        }
        let lo = lo.clamp(0, len_k) as usize;
        let hi = hi.clamp(0, len_k) as usize;
        lo..hi.max(lo)
    }

    /// Whether query `i` of batch entry `b` may attend to key `j`.
    pub fn allowed(&self, b: usize, i: usize, j: usize) -> bool {
        self.key_range(b, i).contains(&j)
    }

    fn row_offset(&self, s: Strides, cu: Option<&[usize]>, b: usize, n: usize, h: usize) -> usize {
        match cu {
            Some(cu) => (cu[b] + n) * s.seq + h * s.head,
            None => b * s.batch + n * s.seq + h * s.head,
        }
    }
    fn cu_q(&self) -> Option<&[usize]> {
        match &self.lengths {
            SeqLengths::Varlen { cu_seqlens_q, .. } => Some(cu_seqlens_q),
            _ => None,
        }
    }
    fn cu_k(&self) -> Option<&[usize]> {
        match &self.lengths {
            SeqLengths::Varlen { cu_seqlens_k, .. } => Some(cu_seqlens_k),
            _ => None,
        }
    }

    /// Element offset of `q[b, i, h, 0]`.
    pub fn q_offset(&self, b: usize, i: usize, h: usize) -> usize {
        self.row_offset(self.q, self.cu_q(), b, i, h)
    }
    /// Element offset of `k[b, j, hk, 0]`.
    pub fn k_offset(&self, b: usize, j: usize, hk: usize) -> usize {
        self.row_offset(self.k, self.cu_k(), b, j, hk)
    }
    /// Element offset of `v[b, j, hk, 0]`.
    pub fn v_offset(&self, b: usize, j: usize, hk: usize) -> usize {
        self.row_offset(self.v, self.cu_k(), b, j, hk)
    }
    /// Element offset of `o[b, i, h, 0]` (and of dO).
    pub fn o_offset(&self, b: usize, i: usize, h: usize) -> usize {
        self.row_offset(self.o, self.cu_q(), b, i, h)
    }
    /// Element offset of `dq[b, i, h, 0]`.
    pub fn dq_offset(&self, b: usize, i: usize, h: usize) -> usize {
        self.row_offset(self.dq, self.cu_q(), b, i, h)
    }
    /// Element offset of `dk[b, j, hk, 0]`.
    pub fn dk_offset(&self, b: usize, j: usize, hk: usize) -> usize {
        self.row_offset(self.dk, self.cu_k(), b, j, hk)
    }
    /// Element offset of `dv[b, j, hk, 0]`.
    pub fn dv_offset(&self, b: usize, j: usize, hk: usize) -> usize {
        self.row_offset(self.dv, self.cu_k(), b, j, hk)
    }
    /// Index of the statistic (LSE or Taylor denominator) of query `i`, head `h`, batch entry `b`.
    pub fn stats_index(&self, b: usize, h: usize, i: usize) -> usize {
        match self.cu_q() {
            Some(cu) => h * self.total_q + cu[b] + i,
            None => (b * self.heads_q + h) * self.seq_q + i,
        }
    }
    /// Index of `bias[b, h, i, j]` (broadcast dims collapse), if the spec has a bias.
    pub fn bias_index(&self, b: usize, h: usize, i: usize, j: usize) -> Option<usize> {
        self.bias.map(|s| {
            let bb = if s.batch == 1 { 0 } else { b };
            let bh = if s.heads == 1 { 0 } else { h };
            ((bb * s.heads + bh) * self.seq_q + i) * self.seq_k + j
        })
    }

    /// Elements the q buffer needs (its strides' extent; computed once, with checked arithmetic, by
    /// `validate`).
    pub fn q_len(&self) -> usize {
        self.lens.q
    }
    /// Elements the k buffer needs (its strides' extent).
    pub fn k_len(&self) -> usize {
        self.lens.k
    }
    /// Elements the v buffer needs (its strides' extent).
    pub fn v_len(&self) -> usize {
        self.lens.v
    }
    /// Length of o and dO.
    pub fn o_len(&self) -> usize {
        self.lens.o
    }
    /// Length of dq.
    pub fn dq_len(&self) -> usize {
        self.lens.dq
    }
    /// Length of dk.
    pub fn dk_len(&self) -> usize {
        self.lens.dk
    }
    /// Length of dv.
    pub fn dv_len(&self) -> usize {
        self.lens.dv
    }
    /// Length of the statistics (one f32 per query row and query head).
    pub fn stats_len(&self) -> usize {
        self.lens.stats
    }
    /// Length of the bias (and dbias) buffer; 0 without a bias.
    pub fn bias_len(&self) -> usize {
        self.lens.bias
    }

    /// Logical shape of q for messages: `[B, Nq, Hq, D]` or `[total_q, Hq, D]`.
    pub fn q_shape(&self) -> Vec<usize> {
        self.shape(self.seq_q, self.total_q, self.heads_q, self.head_dim)
    }
    /// Logical shape of k for messages: `[B, Nk, Hkv, D]` or `[total_k, Hkv, D]`.
    pub fn k_shape(&self) -> Vec<usize> {
        self.shape(self.seq_k, self.total_k, self.heads_kv, self.head_dim)
    }
    /// Logical shape of v for messages: `[B, Nk, Hkv, Dv]` or `[total_k, Hkv, Dv]`.
    pub fn v_shape(&self) -> Vec<usize> {
        self.shape(self.seq_k, self.total_k, self.heads_kv, self.head_dim_v)
    }
    /// Logical shape of o for messages: `[B, Nq, Hq, Dv]` or `[total_q, Hq, Dv]`.
    pub fn o_shape(&self) -> Vec<usize> {
        self.shape(self.seq_q, self.total_q, self.heads_q, self.head_dim_v)
    }
    fn shape(&self, n: usize, total: usize, h: usize, d: usize) -> Vec<usize> {
        match (self.is_varlen(), self.layout) {
            (true, Layout::Bnhd) => vec![total, h, d],
            (true, Layout::Bhnd) => vec![h, total, d],
            (false, Layout::Bnhd) => vec![self.batch, n, h, d],
            (false, Layout::Bhnd) => vec![self.batch, h, n, d],
        }
    }

    /// Check that a buffer named `what` has at least `required` elements.
    pub fn check_len(&self, pass: Pass, what: &str, len: usize, required: usize) -> Result<()> {
        if len < required {
            return Err(AttnError::ShapeMismatch {
                op: self.op(pass),
                what: what.to_string(),
                expected: format!("at least {required} elements"),
                got: format!("{len} elements"),
            });
        }
        Ok(())
    }
}
