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
    bf16, f16, shape_str, Aggregation, AttnProblem, AttnSpec, Causal, DType, Element, Family, Layout,
};
use attn_cpu_ref::testing::{random_case, Case};
use attn_cpu_ref::{backward, backward_f64, forward, forward_f64, Forward, Gradients, Inputs};
use compare::{compare, Comparison};
pub use example::{make_example, ExampleShape, EXAMPLE_SHAPE};
pub use family::{family_with_options, FamilyOptions};
use safetensors::Dtype as StDtype;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub mod compare;
#[cfg(feature = "cuda")]
mod cuda;
mod example;
mod family;
mod input;
mod output;

pub use input::{parse, ParsedCall, MAX_INPUT_BYTES};
use input::{parsed, reader, too_large, HostInputs, Reader};
use output::{outputs, serialize, stats_name, tensor_lines, write_bytes, write_file, Out};

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
    write_bytes(output, &file)?;
    Ok(summary)
}

#[cfg(test)]
mod tests;
