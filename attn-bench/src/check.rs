//! `attn-bench check`: run one attention call on tensors from a safetensors file and write what it
//! computed, so a user can compare us with their own code bit for bit.
//!
//! Input tensors (names are fixed; q, k, v share one dtype among F32, F16, BF16):
//! - `q`, `k`, `v`: `[B, N, H, D]` (layout `bnhd`, the default) or `[B, H, N, D]` (`bhnd`); packed
//!   variable-length batches are `[total, H, D]` (`[H, total, D]` for `bhnd`) with `cu_seqlens_q`
//!   and `cu_seqlens_k` (integer, `[B + 1]`);
//! - optional `do` (dL/do, shaped like o): when present the backward runs too;
//! - optional `bias` `[B|1, H|1, Nq, Nk]` (same dtype), optional `key_lens` (integer, `[B]`).
//!
//! Output tensors: `o` (storage dtype, q's layout with Dv), the f32 statistics as `lse`
//! (softmax-like families, `[B, Hq, Nq]` or `[Hq, total_q]`) or `den` (Taylor), and with `do` the
//! gradients `dq`, `dk`, `dv` (and `dbias`) shaped like their inputs. The file's metadata names the
//! implementation, family and parameters.

use crate::error::BenchError;
use crate::grid::FamilyId;
use crate::impls::family_params;
use attn_core::{
    bf16, f16, shape_str, Aggregation, AttnError, AttnProblem, AttnSpec, Causal, DType, Element, Family,
    Layout, Op, Pass,
};
use attn_cpu_ref::{backward, forward, Inputs};
use safetensors::tensor::TensorView;
use safetensors::{Dtype as StDtype, SafeTensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Where the call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckDevice {
    Cpu,
    Cuda,
}

/// Everything about the call that the tensors do not say.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckOptions {
    pub family: Family,
    pub layout: Layout,
    pub causal: Causal,
    /// Sliding window `(left, right)`, `None` for no window.
    pub window: Option<(Option<usize>, Option<usize>)>,
    pub device: CheckDevice,
}

/// What `check` wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckSummary {
    pub output: PathBuf,
    pub tensors: Vec<String>,
    pub description: String,
}

/// A storage element as safetensors stores it (little endian).
trait Stored: Element {
    const ST_DTYPE: StDtype;
    fn decode(bytes: &[u8]) -> Vec<Self>;
    fn encode(xs: &[Self]) -> Vec<u8>;
}

impl Stored for f32 {
    const ST_DTYPE: StDtype = StDtype::F32;
    fn decode(bytes: &[u8]) -> Vec<Self> {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
    fn encode(xs: &[Self]) -> Vec<u8> {
        xs.iter().flat_map(|x| x.to_le_bytes()).collect()
    }
}

impl Stored for f16 {
    const ST_DTYPE: StDtype = StDtype::F16;
    fn decode(bytes: &[u8]) -> Vec<Self> {
        bytes
            .chunks_exact(2)
            .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
            .collect()
    }
    fn encode(xs: &[Self]) -> Vec<u8> {
        xs.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect()
    }
}

impl Stored for bf16 {
    const ST_DTYPE: StDtype = StDtype::BF16;
    fn decode(bytes: &[u8]) -> Vec<Self> {
        bytes
            .chunks_exact(2)
            .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
            .collect()
    }
    fn encode(xs: &[Self]) -> Vec<u8> {
        xs.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect()
    }
}

struct Reader<'a> {
    path: &'a Path,
    st: SafeTensors<'a>,
}

impl<'a> Reader<'a> {
    fn err(&self, reason: String) -> BenchError {
        BenchError::Safetensors {
            path: self.path.to_path_buf(),
            reason,
        }
    }

    fn get(&self, name: &str) -> Option<TensorView<'a>> {
        self.st.tensor(name).ok()
    }

    fn require(&self, name: &str) -> Result<TensorView<'a>, BenchError> {
        self.get(name).ok_or_else(|| {
            self.err(format!(
                "missing tensor `{name}` (have: {})",
                self.names().join(", ")
            ))
        })
    }

    fn names(&self) -> Vec<String> {
        let mut n: Vec<String> = self.st.names().into_iter().map(String::from).collect();
        n.sort();
        n
    }

    /// An integer vector (key lengths, cumulative offsets), any integer dtype, no negatives.
    fn indices(&self, name: &str) -> Result<Option<Vec<usize>>, BenchError> {
        let Some(t) = self.get(name) else { return Ok(None) };
        if t.shape().len() != 1 {
            return Err(self.err(format!(
                "`{name}` must be 1-d, has shape {}",
                shape_str(t.shape())
            )));
        }
        let b = t.data();
        // Internal invariant (the expects below): chunks_exact(n) yields slices of exactly n bytes.
        let values: Vec<i128> = match t.dtype() {
            StDtype::I64 => b
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("chunks_exact(8)")) as i128)
                .collect(),
            StDtype::U64 => b
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("chunks_exact(8)")) as i128)
                .collect(),
            StDtype::I32 => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().expect("chunks_exact(4)")) as i128)
                .collect(),
            StDtype::U32 => b
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("chunks_exact(4)")) as i128)
                .collect(),
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

fn expect_shape(op: Op, what: &str, got: &[usize], expected: &[usize]) -> Result<(), BenchError> {
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
fn build_spec(r: &Reader<'_>, opts: &CheckOptions, dtype: DType) -> Result<AttnSpec, BenchError> {
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

struct Out {
    name: &'static str,
    dtype: StDtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn run_typed<E: Stored>(r: &Reader<'_>, spec: &AttnSpec) -> Result<Vec<Out>, BenchError> {
    let q: Vec<E> = r.values(&r.require("q")?, "q")?;
    let k: Vec<E> = r.values(&r.require("k")?, "k")?;
    let v: Vec<E> = r.values(&r.require("v")?, "v")?;
    let bias: Option<Vec<E>> = r.get("bias").map(|b| r.values(&b, "bias")).transpose()?;
    let d_o: Option<Vec<E>> = r.get("do").map(|t| r.values(&t, "do")).transpose()?;
    let x = Inputs {
        q: &q,
        k: &k,
        v: &v,
        bias: bias.as_deref(),
    };
    let f = forward(spec, x)?;
    let stats_shape = if spec.is_varlen() {
        vec![spec.heads_q(), spec.total_q()]
    } else {
        vec![spec.batch(), spec.heads_q(), spec.seq_q()]
    };
    let mut out = vec![
        Out {
            name: "o",
            dtype: E::ST_DTYPE,
            shape: spec.o_shape(),
            data: E::encode(&f.o),
        },
        Out {
            name: if spec.family().is_softmax_like() {
                "lse"
            } else {
                "den"
            },
            dtype: StDtype::F32,
            shape: stats_shape,
            data: f32::encode(&f.stats),
        },
    ];
    if let Some(d_o) = d_o {
        let g = backward(spec, x, &f.o, &d_o, &f.stats)?;
        out.push(Out {
            name: "dq",
            dtype: E::ST_DTYPE,
            shape: spec.q_shape(),
            data: E::encode(&g.dq),
        });
        out.push(Out {
            name: "dk",
            dtype: E::ST_DTYPE,
            shape: spec.k_shape(),
            data: E::encode(&g.dk),
        });
        out.push(Out {
            name: "dv",
            dtype: E::ST_DTYPE,
            shape: spec.v_shape(),
            data: E::encode(&g.dv),
        });
        if let (Some(db), Some(bs)) = (g.dbias, spec.bias()) {
            out.push(Out {
                name: "dbias",
                dtype: E::ST_DTYPE,
                shape: vec![bs.batch, bs.heads, spec.seq_q(), spec.seq_k()],
                data: E::encode(&db),
            });
        }
    }
    Ok(out)
}

/// Read `input`, run the call on `opts.device`, write `output`.
pub fn check(
    input: &Path,
    output: &Path,
    opts: &CheckOptions,
    commit: &str,
) -> Result<CheckSummary, BenchError> {
    if opts.device == CheckDevice::Cuda {
        return Err(BenchError::Unavailable {
            implementation: "attn-cuda",
            reason: "attn-bench is built without the `cuda` feature (attn-cuda has no launch API yet)".into(),
        });
    }
    let bytes = std::fs::read(input).map_err(|e| BenchError::io(input, e))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| BenchError::Safetensors {
        path: input.to_path_buf(),
        reason: e.to_string(),
    })?;
    let r = Reader { path: input, st };
    let dtype = match r.require("q")?.dtype() {
        StDtype::F32 => DType::F32,
        StDtype::F16 => DType::F16,
        StDtype::BF16 => DType::BF16,
        other => return Err(r.err(format!("q is {other:?}; supported: F32, F16, BF16"))),
    };
    let spec = build_spec(&r, opts, dtype)?;
    let outs = match dtype {
        DType::F32 => run_typed::<f32>(&r, &spec)?,
        DType::F16 => run_typed::<f16>(&r, &spec)?,
        DType::BF16 => run_typed::<bf16>(&r, &spec)?,
    };
    let write_err = |reason: String| BenchError::Safetensors {
        path: output.to_path_buf(),
        reason,
    };
    let views = outs
        .iter()
        .map(|o| {
            TensorView::new(o.dtype, o.shape.clone(), &o.data)
                .map(|v| (o.name, v))
                .map_err(|e| write_err(e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let metadata = HashMap::from([
        ("impl".to_string(), "attn-cpu-ref".to_string()),
        ("family".to_string(), spec.family().label().to_string()),
        ("params".to_string(), family_params(&spec)),
        ("causal".to_string(), format!("{:?}", spec.causal())),
        ("commit".to_string(), commit.to_string()),
    ]);
    safetensors::tensor::serialize_to_file(views, Some(metadata), output)
        .map_err(|e| write_err(e.to_string()))?;
    Ok(CheckSummary {
        output: output.to_path_buf(),
        tensors: outs
            .iter()
            .map(|o| format!("{} {:?} {}", o.name, o.dtype, shape_str(&o.shape)))
            .collect(),
        description: format!(
            "{} ({}) {} q {} k {} v {} causal {:?}",
            spec.family().label(),
            family_params(&spec),
            spec.dtype(),
            shape_str(&spec.q_shape()),
            shape_str(&spec.k_shape()),
            shape_str(&spec.v_shape()),
            spec.causal()
        ),
    })
}

/// Family parameters a user can set on the command line; `None` keeps the family's default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FamilyOptions {
    pub scale: Option<f32>,
    pub softcap: Option<f32>,
    /// Taylor `[a0, a1]` or `[a0, a1, a2]`.
    pub a: Option<Vec<f32>>,
    /// `qk_l2norm` of cosine-sim and Taylor.
    pub l2norm: Option<bool>,
    pub eps: Option<f32>,
    pub curvature: Option<f32>,
    pub beta: Option<f32>,
    pub aggregation: Option<Aggregation>,
}

/// The family `id` with the options applied; an option the family does not have is an error.
///
/// ```
/// use attn_bench::check::{family_with_options, FamilyOptions};
/// use attn_bench::grid::FamilyId;
/// use attn_core::Family;
/// let opts = FamilyOptions { scale: Some(0.5), ..Default::default() };
/// let f = family_with_options(FamilyId::Softmax, &opts).unwrap();
/// assert!(matches!(f, Family::Softmax(p) if p.scale == Some(0.5)));
/// let bad = FamilyOptions { curvature: Some(2.0), ..Default::default() };
/// assert!(family_with_options(FamilyId::Softmax, &bad).is_err());
/// ```
pub fn family_with_options(id: FamilyId, o: &FamilyOptions) -> Result<Family, BenchError> {
    let mut family = id.family();
    let reject = |arg: &'static str, given: bool| -> Result<(), BenchError> {
        if given {
            return Err(BenchError::InvalidArgument {
                arg,
                reason: format!("does not apply to the {id} family"),
            });
        }
        Ok(())
    };
    match &mut family {
        Family::Softmax(p) => {
            p.scale = o.scale.or(p.scale);
            p.softcap = o.softcap.or(p.softcap);
            reject("a", o.a.is_some())?;
            reject("l2norm", o.l2norm.is_some())?;
            reject("eps", o.eps.is_some())?;
        }
        Family::CosineSim(p) => {
            p.scale = o.scale.unwrap_or(p.scale);
            p.qk_l2norm = o.l2norm.unwrap_or(p.qk_l2norm);
            p.eps = o.eps.unwrap_or(p.eps);
            reject("softcap", o.softcap.is_some())?;
            reject("a", o.a.is_some())?;
        }
        Family::Taylor(p) => {
            p.scale = o.scale.or(p.scale);
            p.qk_l2norm = o.l2norm.unwrap_or(p.qk_l2norm);
            if let Some(a) = &o.a {
                match (a.as_slice(), p.order) {
                    (&[a0, a1], 1) => p.a = [a0, a1, 0.0],
                    (&[a0, a1, a2], 2) => p.a = [a0, a1, a2],
                    _ => {
                        return Err(BenchError::InvalidArgument {
                            arg: "a",
                            reason: format!(
                                "order {} takes {} coefficients, got {a:?}",
                                p.order,
                                p.order + 1
                            ),
                        })
                    }
                }
            }
            reject("softcap", o.softcap.is_some())?;
            reject("eps", o.eps.is_some())?;
        }
        Family::Hyperbolic(p) => {
            p.curvature = o.curvature.unwrap_or(p.curvature);
            p.beta = o.beta.unwrap_or(p.beta);
            p.aggregation = o.aggregation.unwrap_or(p.aggregation);
            reject("scale", o.scale.is_some())?;
            reject("softcap", o.softcap.is_some())?;
            reject("a", o.a.is_some())?;
            reject("l2norm", o.l2norm.is_some())?;
            reject("eps", o.eps.is_some())?;
        }
    }
    if !matches!(family, Family::Hyperbolic(_)) {
        reject("curvature", o.curvature.is_some())?;
        reject("beta", o.beta.is_some())?;
        reject("aggregation", o.aggregation.is_some())?;
    }
    Ok(family)
}
