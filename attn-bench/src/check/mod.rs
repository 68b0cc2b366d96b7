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
//!
//! Devices: `cpu` runs attn-cpu-ref (f64 inside, every output rounded once to the storage dtype:
//! the reference itself). `cuda` (the `cuda` feature, a GPU, attn-cuda's kernels) runs attn-cuda's
//! forward and, with `do`, its backward from its own `o` and statistics, writes the same tensors,
//! and compares each with the f64 reference on the same stored inputs ([`compare`]): the largest
//! difference beside the error of the reference rounded to the storage dtype.
//! [`make_example`] writes an input file to start from.

use crate::error::BenchError;
use crate::grid::FamilyId;
use crate::impls::family_params;
use attn_core::{
    bf16, f16, shape_str, Aggregation, AttnError, AttnProblem, AttnSpec, Causal, DType, Element, Family,
    Layout, Op, Pass,
};
use attn_cpu_ref::testing::{random_case, Case};
use attn_cpu_ref::{backward, backward_f64, forward, forward_f64, Forward, Gradients, Inputs};
use compare::{compare, Comparison};
pub use example::{make_example, ExampleShape, EXAMPLE_SHAPE};
pub use family::{family_with_options, FamilyOptions};
use safetensors::tensor::TensorView;
use safetensors::{Dtype as StDtype, SafeTensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub mod compare;
#[cfg(feature = "cuda")]
mod cuda;
mod example;
mod family;

/// Where the call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckDevice {
    /// attn-cpu-ref: the f64 reference, rounded once to the storage dtype.
    Cpu,
    /// attn-cuda on GPU 0 (the `cuda` feature).
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
    /// On [`CheckDevice::Cuda`], also run the f64 reference on the CPU and compare (slow on large
    /// inputs: turn it off there). Ignored on the CPU.
    pub reference: bool,
}

/// What `check` wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckSummary {
    pub output: PathBuf,
    /// One line per tensor written: name, dtype, shape.
    pub tensors: Vec<String>,
    pub description: String,
    /// The device's tensors against the f64 reference (empty on the CPU or without `reference`).
    pub comparisons: Vec<Comparison>,
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

/// One tensor of an output (or example) file.
struct Out {
    name: &'static str,
    dtype: StDtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

/// The input tensors of a call in their storage dtype, as the file holds them.
struct HostInputs<E> {
    q: Vec<E>,
    k: Vec<E>,
    v: Vec<E>,
    bias: Option<Vec<E>>,
    d_o: Option<Vec<E>>,
}

impl<E: Stored> HostInputs<E> {
    fn read(r: &Reader<'_>) -> Result<Self, BenchError> {
        Ok(HostInputs {
            q: r.values(&r.require("q")?, "q")?,
            k: r.values(&r.require("k")?, "k")?,
            v: r.values(&r.require("v")?, "v")?,
            bias: r.get("bias").map(|b| r.values(&b, "bias")).transpose()?,
            d_o: r.get("do").map(|t| r.values(&t, "do")).transpose()?,
        })
    }

    fn inputs(&self) -> Inputs<'_, E> {
        Inputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            bias: self.bias.as_deref(),
        }
    }
}

/// The name of the statistics tensor: `lse` for the softmax-like families, `den` for Taylor.
fn stats_name(spec: &AttnSpec) -> &'static str {
    if spec.family().is_softmax_like() {
        "lse"
    } else {
        "den"
    }
}

/// The output tensors of a forward (and backward) in the file's layout.
fn outputs<E: Stored>(spec: &AttnSpec, f: &Forward<E, f32>, g: Option<&Gradients<E>>) -> Vec<Out> {
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
            name: stats_name(spec),
            dtype: StDtype::F32,
            shape: stats_shape,
            data: f32::encode(&f.stats),
        },
    ];
    if let Some(g) = g {
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
        if let (Some(db), Some(bs)) = (&g.dbias, spec.bias()) {
            out.push(Out {
                name: "dbias",
                dtype: E::ST_DTYPE,
                shape: vec![bs.batch, bs.heads, spec.seq_q(), spec.seq_k()],
                data: E::encode(db),
            });
        }
    }
    out
}

/// attn-cpu-ref on the file's tensors: f64 inside, outputs rounded once to the storage dtype.
fn cpu_outputs<E: Stored>(r: &Reader<'_>, spec: &AttnSpec) -> Result<Vec<Out>, BenchError> {
    let x = HostInputs::<E>::read(r)?;
    let f = forward(spec, x.inputs())?;
    let g = x
        .d_o
        .as_deref()
        .map(|d_o| backward(spec, x.inputs(), &f.o, d_o, &f.stats))
        .transpose()?;
    Ok(outputs(spec, &f, g.as_ref()))
}

fn widen<E: Element>(x: &[E]) -> Vec<f64> {
    x.iter().map(|e| e.to_f64()).collect()
}

/// Compare a device's forward (and backward, when the inputs have `do`) with the f64 reference
/// on the same stored inputs ([`compare`]): `o`, the statistics, and `dq`, `dk`, `dv`, `dbias`.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // the device path and the tests call it
fn reference_comparisons<E: Stored>(
    spec: &AttnSpec,
    x: &HostInputs<E>,
    f: &Forward<E, f32>,
    g: Option<&Gradients<E>>,
) -> Result<Vec<Comparison>, BenchError> {
    let (q, k, v) = (widen(&x.q), widen(&x.k), widen(&x.v));
    let bias = x.bias.as_deref().map(widen);
    let inputs = Inputs {
        q: &q,
        k: &k,
        v: &v,
        bias: bias.as_deref(),
    };
    let dtype = spec.dtype().name();
    let round = |x: f64| E::from_f64(x).to_f64();
    let reference = forward_f64(spec, inputs)?;
    let stats: Vec<f64> = f.stats.iter().map(|&s| s as f64).collect();
    let mut out = vec![
        compare("o", &widen(&f.o), &reference.o, dtype, round),
        compare(stats_name(spec), &stats, &reference.stats, "f32", |x| {
            x as f32 as f64
        }),
    ];
    if let (Some(g), Some(d_o)) = (g, x.d_o.as_deref()) {
        let rg = backward_f64(spec, inputs, &reference.o, &widen(d_o), &reference.stats)?;
        out.push(compare("dq", &widen(&g.dq), &rg.dq, dtype, round));
        out.push(compare("dk", &widen(&g.dk), &rg.dk, dtype, round));
        out.push(compare("dv", &widen(&g.dv), &rg.dv, dtype, round));
        if let (Some(db), Some(rdb)) = (&g.dbias, &rg.dbias) {
            out.push(compare("dbias", &widen(db), rdb, dtype, round));
        }
    }
    Ok(out)
}

/// The device path: attn-cuda's outputs and, unless `reference` is false, their comparison with
/// the f64 reference.
#[cfg(feature = "cuda")]
fn cuda_outputs(
    r: &Reader<'_>,
    spec: &AttnSpec,
    reference: bool,
) -> Result<(Vec<Out>, Vec<Comparison>), BenchError> {
    cuda::run(r, spec, reference)
}

#[cfg(not(feature = "cuda"))]
fn cuda_outputs(_: &Reader<'_>, _: &AttnSpec, _: bool) -> Result<(Vec<Out>, Vec<Comparison>), BenchError> {
    Err(cuda_unavailable())
}

/// Why `--device cuda` cannot run in this build.
#[cfg(not(feature = "cuda"))]
fn cuda_unavailable() -> BenchError {
    BenchError::Unavailable {
        implementation: "attn-cuda",
        reason: crate::impls::NO_CUDA_FEATURE.into(),
    }
}

/// Whether `--device cuda` can run here: the `cuda` feature, a GPU and attn-cuda's kernels.
pub fn cuda_ready() -> Result<(), BenchError> {
    #[cfg(feature = "cuda")]
    {
        cuda::gpu_handle().map(drop)
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(cuda_unavailable())
    }
}

/// `outs` as a safetensors file (`path` names it in errors).
fn serialize(path: &Path, outs: &[Out], metadata: HashMap<String, String>) -> Result<Vec<u8>, BenchError> {
    let write_err = |reason: String| BenchError::Safetensors {
        path: path.to_path_buf(),
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
    safetensors::tensor::serialize(views, Some(metadata)).map_err(|e| write_err(e.to_string()))
}

/// Write `outs` to `path`, creating its folder if missing.
fn write_file(path: &Path, outs: &[Out], metadata: HashMap<String, String>) -> Result<(), BenchError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
    }
    let file = serialize(path, outs, metadata)?;
    std::fs::write(path, file).map_err(|e| BenchError::io(path, e))
}

fn tensor_lines(outs: &[Out]) -> Vec<String> {
    outs.iter()
        .map(|o| format!("{} {:?} {}", o.name, o.dtype, shape_str(&o.shape)))
        .collect()
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
fn reader<'a>(path: &'a Path, bytes: &'a [u8], limit: u64) -> Result<(Reader<'a>, DType), BenchError> {
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
fn parsed(r: &Reader<'_>, opts: &CheckOptions, dtype: DType) -> Result<ParsedCall, BenchError> {
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

fn too_large(path: &Path, len: u64) -> BenchError {
    BenchError::Safetensors {
        path: path.to_path_buf(),
        reason: format!(
            "{len} bytes is more than the {MAX_INPUT_BYTES}-byte limit of `check` (MAX_INPUT_BYTES)"
        ),
    }
}

/// Run the call a safetensors input in memory describes ([`parse`], then `opts.device`) and return what
/// [`check`] would write: the summary (its `output` is `output`) and the output file's bytes.
pub fn check_bytes(
    bytes: &[u8],
    output: &Path,
    opts: &CheckOptions,
    commit: &str,
) -> Result<(CheckSummary, Vec<u8>), BenchError> {
    run_bytes(Path::new("<input>"), bytes, output, opts, commit)
}

fn run_bytes(
    input: &Path,
    bytes: &[u8],
    output: &Path,
    opts: &CheckOptions,
    commit: &str,
) -> Result<(CheckSummary, Vec<u8>), BenchError> {
    if opts.device == CheckDevice::Cuda {
        cuda_ready()?;
    }
    let (r, dtype) = reader(input, bytes, MAX_INPUT_BYTES)?;
    let spec = parsed(&r, opts, dtype)?.spec;
    let (implementation, outs, comparisons) = match opts.device {
        CheckDevice::Cpu => {
            let outs = match dtype {
                DType::F32 => cpu_outputs::<f32>(&r, &spec)?,
                DType::F16 => cpu_outputs::<f16>(&r, &spec)?,
                DType::BF16 => cpu_outputs::<bf16>(&r, &spec)?,
            };
            ("attn-cpu-ref", outs, Vec::new())
        }
        CheckDevice::Cuda => {
            let (outs, comparisons) = cuda_outputs(&r, &spec, opts.reference)?;
            ("attn-cuda", outs, comparisons)
        }
    };
    let mut metadata = HashMap::from([
        ("impl".to_string(), implementation.to_string()),
        ("family".to_string(), spec.family().label().to_string()),
        ("params".to_string(), family_params(&spec)),
        ("causal".to_string(), format!("{:?}", spec.causal())),
        ("commit".to_string(), commit.to_string()),
    ]);
    if !comparisons.is_empty() {
        let diffs: Vec<String> = comparisons
            .iter()
            .map(|c| format!("{} {:.3e}", c.name, c.max_abs_diff))
            .collect();
        metadata.insert("max_abs_diff_vs_f64_reference".into(), diffs.join(", "));
    }
    let file = serialize(output, &outs, metadata)?;
    let summary = CheckSummary {
        output: output.to_path_buf(),
        tensors: tensor_lines(&outs),
        description: format!(
            "{implementation}: {} ({}) {} q {} k {} v {} causal {:?}",
            spec.family().label(),
            family_params(&spec),
            spec.dtype(),
            shape_str(&spec.q_shape()),
            shape_str(&spec.k_shape()),
            shape_str(&spec.v_shape()),
            spec.causal()
        ),
        comparisons,
    };
    Ok((summary, file))
}

/// Read `input`, run the call on `opts.device`, write `output`.
///
/// On [`CheckDevice::Cuda`] the device is checked before the file is read: a build without the
/// `cuda` feature, a machine without a GPU or a build without attn-cuda's kernels is a
/// [`BenchError::Unavailable`] saying which. A file larger than [`MAX_INPUT_BYTES`] is an error before
/// it is read.
pub fn check(
    input: &Path,
    output: &Path,
    opts: &CheckOptions,
    commit: &str,
) -> Result<CheckSummary, BenchError> {
    if opts.device == CheckDevice::Cuda {
        cuda_ready()?;
    }
    let len = std::fs::metadata(input)
        .map_err(|e| BenchError::io(input, e))?
        .len();
    if len > MAX_INPUT_BYTES {
        return Err(too_large(input, len));
    }
    let bytes = std::fs::read(input).map_err(|e| BenchError::io(input, e))?;
    let (summary, file) = run_bytes(input, &bytes, output, opts, commit)?;
    if let Some(dir) = output.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
    }
    std::fs::write(output, file).map_err(|e| BenchError::io(output, e))?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case_inputs<E: Stored>(spec: &AttnSpec) -> HostInputs<E> {
        let case = random_case(spec, 5);
        let narrow = |x: &[f64]| x.iter().map(|&v| E::from_f64(v)).collect::<Vec<E>>();
        HostInputs {
            q: narrow(&case.q),
            k: narrow(&case.k),
            v: narrow(&case.v),
            bias: case.bias.as_deref().map(narrow),
            d_o: Some(narrow(&case.d_o)),
        }
    }

    /// attn-cpu-ref's own outputs, put where a device's go: o and the statistics differ from the
    /// f64 reference by exactly their rounding; the gradients (computed from the rounded o and
    /// statistics) by about as much.
    #[test]
    fn reference_comparisons_of_the_rounded_reference_are_its_rounding() {
        let spec = AttnProblem::new(Family::softmax(), DType::BF16, 1, 2, 1, 6, 9, 8)
            .with_causal(Causal::BottomRight)
            .with_bias(1, 2)
            .validate()
            .expect("valid spec");
        let x = case_inputs::<bf16>(&spec);
        let f = forward(&spec, x.inputs()).expect("forward");
        let d_o = x.d_o.as_deref().expect("do");
        let g = backward(&spec, x.inputs(), &f.o, d_o, &f.stats).expect("backward");
        let c = reference_comparisons(&spec, &x, &f, Some(&g)).expect("compares");
        let names: Vec<&str> = c.iter().map(|c| c.name).collect();
        assert_eq!(names, ["o", "lse", "dq", "dk", "dv", "dbias"]);
        for c in &c {
            assert_eq!(c.not_finite, 0, "{c}");
            assert!(c.rounding > 0.0, "{c}");
            assert!(
                c.max_abs_diff <= 2.0 * c.rounding + 1e-6 * c.max_abs_reference,
                "{c}"
            );
        }
        assert_eq!(c[0].max_abs_diff, c[0].rounding);
        assert_eq!(c[1].max_abs_diff, c[1].rounding);
        assert_eq!((c[0].dtype, c[1].dtype), ("bf16", "f32"));
    }

    #[test]
    fn an_unwritten_output_element_is_a_non_finite_mismatch() {
        let spec = AttnProblem::new(Family::taylor(1), DType::F32, 1, 1, 1, 4, 4, 8)
            .validate()
            .expect("valid spec");
        let mut x = case_inputs::<f32>(&spec);
        x.d_o = None;
        let mut f = forward(&spec, x.inputs()).expect("forward");
        f.o[3] = f32::NAN;
        let c = reference_comparisons(&spec, &x, &f, None).expect("compares");
        assert_eq!(c.len(), 2, "no do: o and den only");
        assert_eq!((c[0].name, c[0].not_finite), ("o", 1));
        assert_eq!(c[0].max_abs_diff, f64::INFINITY);
        assert_eq!((c[1].name, c[1].not_finite), ("den", 0));
    }

    /// A safetensors file of `tensors` (name, dtype, shape, bytes).
    fn file(tensors: &[(&str, StDtype, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
        let views: Vec<(&str, TensorView<'_>)> = tensors
            .iter()
            .map(|(n, d, s, b)| {
                (
                    *n,
                    TensorView::new(*d, s.clone(), b).expect("a consistent tensor"),
                )
            })
            .collect();
        safetensors::tensor::serialize(views, None).expect("serialize")
    }

    fn f32s(shape: &[usize]) -> (StDtype, Vec<usize>, Vec<u8>) {
        let n: usize = shape.iter().product();
        (StDtype::F32, shape.to_vec(), vec![0; 4 * n])
    }

    fn i64s(values: &[i64]) -> (StDtype, Vec<usize>, Vec<u8>) {
        (
            StDtype::I64,
            vec![values.len()],
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
    }

    fn qkv(q: &[usize], k: &[usize], v: &[usize]) -> Vec<(&'static str, StDtype, Vec<usize>, Vec<u8>)> {
        let t = |n, (d, s, b)| (n, d, s, b);
        vec![t("q", f32s(q)), t("k", f32s(k)), t("v", f32s(v))]
    }

    fn opts() -> CheckOptions {
        CheckOptions {
            family: Family::softmax(),
            layout: Layout::Bnhd,
            causal: Causal::None,
            window: None,
            device: CheckDevice::Cpu,
            reference: false,
        }
    }

    /// The error's message; a panic if `r` is not an error.
    fn message(r: Result<ParsedCall, BenchError>) -> String {
        match r {
            Ok(p) => panic!("expected an error, parsed {:?}", p.spec.q_shape()),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_well_formed_file_parses_to_its_call() {
        let mut t = qkv(&[2, 5, 4, 8], &[2, 7, 2, 8], &[2, 7, 2, 8]);
        let (d, s, b) = f32s(&[2, 5, 4, 8]);
        t.push(("do", d, s, b));
        let p = parse(&file(&t), &opts()).expect("a valid call");
        assert_eq!(p.spec.q_shape(), vec![2, 5, 4, 8]);
        assert_eq!((p.spec.heads_kv(), p.spec.seq_k()), (2, 7));
        assert!(p.backward);
        let (summary, out) =
            check_bytes(&file(&t), Path::new("out.safetensors"), &opts(), "test").expect("runs");
        assert!(
            summary.tensors.iter().any(|l| l.starts_with("dq ")),
            "{:?}",
            summary.tensors
        );
        let st = SafeTensors::deserialize(&out).expect("the output is a safetensors file");
        assert_eq!(st.tensor("o").expect("o").shape(), &[2, 5, 4, 8]);
    }

    #[test]
    fn bytes_that_are_not_safetensors_are_errors() {
        for bytes in [
            Vec::new(),
            vec![1, 2, 3],
            // A header length past the end of the file.
            (1u64 << 60).to_le_bytes().to_vec(),
            // A header that is not JSON.
            [8u64.to_le_bytes().to_vec(), b"not json".to_vec()].concat(),
            // A tensor whose offsets run past the data.
            {
                let h = br#"{"q":{"dtype":"F32","shape":[1,1,1,4],"data_offsets":[0,16]}}"#;
                [(h.len() as u64).to_le_bytes().to_vec(), h.to_vec(), vec![0; 8]].concat()
            },
            // Offsets that disagree with the shape.
            {
                let h = br#"{"q":{"dtype":"F32","shape":[1,1,1,4],"data_offsets":[0,8]}}"#;
                [(h.len() as u64).to_le_bytes().to_vec(), h.to_vec(), vec![0; 8]].concat()
            },
        ] {
            let msg = message(parse(&bytes, &opts()));
            assert!(msg.starts_with("safetensors <input>"), "{msg}");
        }
    }

    #[test]
    fn a_file_over_the_size_limit_is_an_error_before_parsing() {
        let bytes = file(&qkv(&[1, 4, 1, 8], &[1, 4, 1, 8], &[1, 4, 1, 8]));
        let err = reader(Path::new("<input>"), &bytes, 64)
            .map(drop)
            .expect_err("over the limit");
        assert!(err.to_string().contains("limit"), "{err}");
        assert!(reader(Path::new("<input>"), &bytes, bytes.len() as u64).is_ok());
    }

    #[test]
    fn missing_or_mistyped_tensors_name_the_tensor() {
        let t = qkv(&[1, 4, 1, 8], &[1, 4, 1, 8], &[1, 4, 1, 8]);
        let msg = message(parse(&file(&t[..2]), &opts()));
        assert!(msg.contains("missing tensor `v`"), "{msg}");
        let mut ints = t.clone();
        ints[0] = ("q", StDtype::I32, vec![1, 4, 1, 8], vec![0; 4 * 32]);
        assert!(message(parse(&file(&ints), &opts())).contains("q is I32"));
        let mut half = t.clone();
        half[1] = ("k", StDtype::F16, vec![1, 4, 1, 8], vec![0; 2 * 32]);
        assert!(message(parse(&file(&half), &opts())).contains("`k` is F16"));
        let mut d_o = t.clone();
        d_o.push(("do", StDtype::BF16, vec![1, 4, 1, 8], vec![0; 2 * 32]));
        assert!(message(parse(&file(&d_o), &opts())).contains("`do` is BF16"));
    }

    #[test]
    fn wrong_ranks_and_shapes_are_shape_errors() {
        for (q, k, v, what) in [
            (vec![4, 1, 8], vec![1, 4, 1, 8], vec![1, 4, 1, 8], "q"),
            (vec![1, 4, 1, 8], vec![2, 4, 1, 8], vec![2, 4, 1, 8], "k"),
            (vec![1, 4, 3, 8], vec![1, 4, 2, 8], vec![1, 4, 2, 8], "k"),
            (vec![1, 4, 1, 8], vec![1, 4, 1, 8], vec![1, 5, 1, 8], "v"),
            (vec![1, 4, 0, 8], vec![1, 4, 1, 8], vec![1, 4, 1, 8], "heads_q"),
        ] {
            let msg = message(parse(&file(&qkv(&q, &k, &v)), &opts()));
            assert!(msg.contains(what), "{q:?} {k:?} {v:?}: {msg}");
        }
        // An empty sequence is a valid (empty) call, as in candle and PyTorch.
        let p = parse(&file(&qkv(&[1, 0, 1, 8], &[1, 4, 1, 8], &[1, 4, 1, 8])), &opts());
        assert_eq!(p.expect("an empty query sequence parses").spec.o_len(), 0);
        let mut t = qkv(&[1, 4, 1, 8], &[1, 4, 1, 8], &[1, 4, 1, 8]);
        let (d, s, b) = f32s(&[1, 4, 1, 9]);
        t.push(("do", d, s, b));
        assert!(message(parse(&file(&t), &opts())).contains("do"));
    }

    #[test]
    fn bad_lengths_are_errors_never_panics() {
        let packed = |cu_q: &[i64], cu_k: &[i64]| {
            let mut t = qkv(&[6, 2, 8], &[6, 2, 8], &[6, 2, 8]);
            let (d, s, b) = i64s(cu_q);
            t.push(("cu_seqlens_q", d, s, b));
            let (d, s, b) = i64s(cu_k);
            t.push(("cu_seqlens_k", d, s, b));
            file(&t)
        };
        assert!(parse(&packed(&[0, 2, 6], &[0, 3, 6]), &opts()).is_ok());
        for (cu_q, cu_k) in [
            (vec![0, -1, 6], vec![0, 3, 6]),
            (vec![0, 1 << 62], vec![0, 6]),
            (vec![0, 4, 2], vec![0, 3, 6]),
            (vec![0, 2, 7], vec![0, 3, 6]),
            (vec![1, 6], vec![0, 6]),
            (vec![0], vec![0]),
            (vec![0, i64::MAX, 6], vec![0, 3, 6]),
        ] {
            let r = parse(&packed(&cu_q, &cu_k), &opts());
            assert!(r.is_err(), "cu_seqlens_q {cu_q:?} cu_seqlens_k {cu_k:?} parsed");
        }
        // Only one of the two offsets.
        let mut t = qkv(&[6, 2, 8], &[6, 2, 8], &[6, 2, 8]);
        let (d, s, b) = i64s(&[0, 6]);
        t.push(("cu_seqlens_q", d, s, b));
        assert!(message(parse(&file(&t), &opts())).contains("or neither"));
        // Key lengths: 2-d, too long, and a float tensor.
        let dense = || qkv(&[2, 4, 1, 8], &[2, 4, 1, 8], &[2, 4, 1, 8]);
        for lens in [
            (
                StDtype::I64,
                vec![1, 2],
                [2i64, 3].iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
            (
                StDtype::I64,
                vec![2],
                [2i64, 9].iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
            (StDtype::F32, vec![2], vec![0u8; 8]),
            (
                StDtype::I64,
                vec![3],
                [1i64, 1, 1].iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
        ] {
            let mut t = dense();
            t.push(("key_lens", lens.0, lens.1.clone(), lens.2.clone()));
            assert!(
                parse(&file(&t), &opts()).is_err(),
                "key_lens {:?} {:?} parsed",
                lens.0,
                lens.1
            );
        }
    }

    #[test]
    fn a_bias_of_the_wrong_rank_or_family_is_an_error() {
        let mut t = qkv(&[1, 4, 2, 8], &[1, 5, 2, 8], &[1, 5, 2, 8]);
        let (d, s, b) = f32s(&[2, 4, 5]);
        t.push(("bias", d, s, b));
        assert!(message(parse(&file(&t), &opts())).contains("bias"));
        let mut t = qkv(&[1, 4, 2, 8], &[1, 5, 2, 8], &[1, 5, 2, 8]);
        let (d, s, b) = f32s(&[1, 2, 4, 5]);
        t.push(("bias", d, s, b));
        assert!(parse(&file(&t), &opts()).is_ok());
        let taylor = CheckOptions {
            family: Family::taylor(2),
            ..opts()
        };
        assert!(parse(&file(&t), &taylor).is_err());
    }
}
