//! Reading a `check` input: the safetensors file's size limit and header, the tensors the call
//! reads (names, dtypes, ranks, shapes, integer vectors) and the validated call they describe.

use super::{CheckOptions, Stored};
use crate::error::BenchError;
use attn_core::{shape_str, AttnError, AttnProblem, AttnSpec, DType, Layout, Op, Pass};
use attn_cpu_ref::Inputs;
use safetensors::tensor::TensorView;
use safetensors::{Dtype as StDtype, SafeTensors};
use std::path::Path;

pub(super) struct Reader<'a> {
    pub(super) path: &'a Path,
    pub(super) st: SafeTensors<'a>,
}

impl<'a> Reader<'a> {
    pub(super) fn err(&self, reason: String) -> BenchError {
        BenchError::Safetensors {
            path: self.path.to_path_buf(),
            reason,
        }
    }

    pub(super) fn get(&self, name: &str) -> Option<TensorView<'a>> {
        self.st.tensor(name).ok()
    }

    pub(super) fn require(&self, name: &str) -> Result<TensorView<'a>, BenchError> {
        self.get(name).ok_or_else(|| {
            self.err(format!(
                "missing tensor `{name}` (have: {})",
                self.names().join(", ")
            ))
        })
    }

    pub(super) fn names(&self) -> Vec<String> {
        let mut n: Vec<String> = self.st.names().into_iter().map(String::from).collect();
        n.sort();
        n
    }

    /// An integer vector (key lengths, cumulative offsets), any integer dtype, no negatives.
    pub(super) fn indices(&self, name: &str) -> Result<Option<Vec<usize>>, BenchError> {
        let Some(t) = self.get(name) else { return Ok(None) };
        if t.shape().len() != 1 {
            return Err(self.err(format!(
                "`{name}` must be 1-d, has shape {}",
                shape_str(t.shape())
            )));
        }
        let b = t.data();
        // Whole little-endian words; a trailing partial word cannot occur (safetensors checks that
        // the byte length is the element count times the dtype's size).
        let values: Vec<i128> = match t.dtype() {
            StDtype::I64 => words::<8>(b).map(|w| i64::from_le_bytes(w) as i128).collect(),
            StDtype::U64 => words::<8>(b).map(|w| u64::from_le_bytes(w) as i128).collect(),
            StDtype::I32 => words::<4>(b).map(|w| i32::from_le_bytes(w) as i128).collect(),
            StDtype::U32 => words::<4>(b).map(|w| u32::from_le_bytes(w) as i128).collect(),
            other => return Err(self.err(format!("`{name}` must be an integer tensor, is {other:?}"))),
        };
        values
            .into_iter()
            .map(|v| {
                usize::try_from(v).map_err(|_| self.err(format!("`{name}` holds {v}, not a valid length")))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    fn values<E: Stored>(&self, t: &TensorView<'_>, name: &str) -> Result<Vec<E>, BenchError> {
        if t.dtype() != E::ST_DTYPE {
            return Err(self.err(format!("`{name}` is {:?}, but q is {:?}", t.dtype(), E::ST_DTYPE)));
        }
        Ok(E::decode(t.data()))
    }
}

/// The `N`-byte words of `b`, in order (a partial word at the end is left out).
fn words<const N: usize>(b: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    b.chunks_exact(N).map(|c| std::array::from_fn(|i| c[i]))
}

pub(super) fn expect_shape(op: Op, what: &str, got: &[usize], expected: &[usize]) -> Result<(), BenchError> {
    if got != expected {
        return Err(AttnError::ShapeMismatch {
            op,
            what: what.into(),
            expected: shape_str(expected),
            got: shape_str(got),
        }
        .into());
    }
    Ok(())
}

/// Build and validate the call the tensors describe.
pub(super) fn build_spec(r: &Reader<'_>, opts: &CheckOptions, dtype: DType) -> Result<AttnSpec, BenchError> {
    let op = Op::new(opts.family.kind(), Pass::Spec);
    let (q, k, v) = (r.require("q")?, r.require("k")?, r.require("v")?);
    let (cu_q, cu_k) = (r.indices("cu_seqlens_q")?, r.indices("cu_seqlens_k")?);
    let mut p = match (cu_q, cu_k) {
        (Some(cu_q), Some(cu_k)) => {
            // Packed: [total, H, D] (bnhd) or [H, total, D] (bhnd).
            let dims = |what: &str, s: &[usize]| match (s, opts.layout) {
                (&[t, h, d], Layout::Bnhd) | (&[h, t, d], Layout::Bhnd) => Ok((t, h, d)),
                _ => Err(BenchError::from(AttnError::ShapeMismatch {
                    op,
                    what: what.into(),
                    expected: format!("a rank-3 packed tensor in {:?} layout", opts.layout),
                    got: shape_str(s),
                })),
            };
            let (_, hq, d) = dims("q", q.shape())?;
            let (_, hk, _) = dims("k", k.shape())?;
            let (_, _, dv) = dims("v", v.shape())?;
            let max_len = |cu: &[usize]| {
                cu.windows(2)
                    .map(|w| w[1].saturating_sub(w[0]))
                    .max()
                    .unwrap_or(0)
            };
            let batch = cu_q.len().saturating_sub(1);
            AttnProblem::new(
                opts.family,
                dtype,
                batch,
                hq,
                hk,
                max_len(&cu_q),
                max_len(&cu_k),
                d,
            )
            .with_head_dim_v(dv)
            .with_layout(opts.layout)
            .with_varlen(cu_q, cu_k)
        }
        (None, None) => {
            AttnProblem::from_shapes(opts.family, dtype, opts.layout, q.shape(), k.shape(), v.shape())?
        }
        _ => return Err(r.err("give both `cu_seqlens_q` and `cu_seqlens_k`, or neither".into())),
    };
    p = p.with_causal(opts.causal);
    if let Some((left, right)) = opts.window {
        p = p.with_window(left, right);
    }
    if let Some(lens) = r.indices("key_lens")? {
        p = p.with_key_lens(lens);
    }
    if let Some(bias) = r.get("bias") {
        match *bias.shape() {
            [bb, bh, _, _] => p = p.with_bias(bb, bh),
            _ => expect_shape(op, "bias", bias.shape(), &[p.batch, p.heads_q, p.seq_q, p.seq_k])?,
        }
    }
    let spec = p.validate()?;
    expect_shape(op, "q", q.shape(), &spec.q_shape())?;
    expect_shape(op, "k", k.shape(), &spec.k_shape())?;
    expect_shape(op, "v", v.shape(), &spec.v_shape())?;
    if let (Some(b), Some(bs)) = (r.get("bias"), spec.bias()) {
        expect_shape(
            op,
            "bias",
            b.shape(),
            &[bs.batch, bs.heads, spec.seq_q(), spec.seq_k()],
        )?;
    }
    if let Some(d_o) = r.get("do") {
        expect_shape(op, "do", d_o.shape(), &spec.o_shape())?;
    }
    Ok(spec)
}

/// The input tensors of a call in their storage dtype, as the file holds them.
pub(super) struct HostInputs<E> {
    pub(super) q: Vec<E>,
    pub(super) k: Vec<E>,
    pub(super) v: Vec<E>,
    pub(super) bias: Option<Vec<E>>,
    pub(super) d_o: Option<Vec<E>>,
}

impl<E: Stored> HostInputs<E> {
    pub(super) fn read(r: &Reader<'_>) -> Result<Self, BenchError> {
        Ok(HostInputs {
            q: r.values(&r.require("q")?, "q")?,
            k: r.values(&r.require("k")?, "k")?,
            v: r.values(&r.require("v")?, "v")?,
            bias: r.get("bias").map(|b| r.values(&b, "bias")).transpose()?,
            d_o: r.get("do").map(|t| r.values(&t, "do")).transpose()?,
        })
    }

    pub(super) fn inputs(&self) -> Inputs<'_, E> {
        Inputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            bias: self.bias.as_deref(),
        }
    }
}

/// The largest input `check` reads: 16 GiB, above any call attn-cpu-ref or one GPU runs (q, k, v and
/// dO of B·H·N·D = 2^31 bf16 elements each are 16 GiB together). A larger file, or a file whose
/// tensors would need more, is an error before anything is allocated for it.
pub const MAX_INPUT_BYTES: u64 = 16 << 30;

/// A call read from a safetensors input and validated: what [`parse`] returns.
#[derive(Clone, Debug)]
pub struct ParsedCall {
    /// The validated call the tensors describe.
    pub spec: AttnSpec,
    /// Whether the file holds `do`, so that the backward runs too.
    pub backward: bool,
}

/// Parse a safetensors input held in memory: the size limit ([`MAX_INPUT_BYTES`]), the safetensors
/// header and offsets, the tensors `check` reads (names, dtypes, ranks, shapes), the integer vectors
/// (`cu_seqlens_*`, `key_lens`), and [`AttnProblem::validate`] on the call they describe. Every
/// malformed input is a [`BenchError`] naming what is wrong; nothing is computed and no file is read or
/// written. `opts` supplies what the tensors do not say (family, layout, mask, window).
pub fn parse(bytes: &[u8], opts: &CheckOptions) -> Result<ParsedCall, BenchError> {
    let (r, dtype) = reader(Path::new("<input>"), bytes, MAX_INPUT_BYTES)?;
    parsed(&r, opts, dtype)
}

/// The size limit (`limit` bytes), then the safetensors header of `bytes` (read from `path`, for errors) and q's dtype.
pub(super) fn reader<'a>(
    path: &'a Path,
    bytes: &'a [u8],
    limit: u64,
) -> Result<(Reader<'a>, DType), BenchError> {
    if bytes.len() as u64 > limit {
        return Err(too_large(path, bytes.len() as u64));
    }
    let st = SafeTensors::deserialize(bytes).map_err(|e| BenchError::Safetensors {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let r = Reader { path, st };
    let dtype = match r.require("q")?.dtype() {
        StDtype::F32 => DType::F32,
        StDtype::F16 => DType::F16,
        StDtype::BF16 => DType::BF16,
        other => return Err(r.err(format!("q is {other:?}; supported: F32, F16, BF16"))),
    };
    Ok((r, dtype))
}

/// The validated call of `r` (q's dtype `dtype`): its shapes, and every tensor the call reads in q's
/// dtype (checked here rather than when the values are read, so that a parsed call runs).
pub(super) fn parsed(r: &Reader<'_>, opts: &CheckOptions, dtype: DType) -> Result<ParsedCall, BenchError> {
    let spec = build_spec(r, opts, dtype)?;
    let q_dtype = r.require("q")?.dtype();
    for name in ["k", "v", "bias", "do"] {
        if let Some(t) = r.get(name) {
            if t.dtype() != q_dtype {
                return Err(r.err(format!("`{name}` is {:?}, but q is {q_dtype:?}", t.dtype())));
            }
        }
    }
    Ok(ParsedCall {
        spec,
        backward: r.get("do").is_some(),
    })
}

pub(super) fn too_large(path: &Path, len: u64) -> BenchError {
    BenchError::Safetensors {
        path: path.to_path_buf(),
        reason: format!(
            "{len} bytes is more than the {MAX_INPUT_BYTES}-byte limit of `check` (MAX_INPUT_BYTES)"
        ),
    }
}
