//! Writing a `check` output: the tensors of a forward (and backward) in the input's layout, as a
//! safetensors file with the call in its metadata.

use super::Stored;
use crate::error::BenchError;
use attn_core::{shape_str, AttnSpec};
use attn_cpu_ref::{Forward, Gradients};
use safetensors::tensor::TensorView;
use safetensors::Dtype as StDtype;
use std::collections::HashMap;
use std::path::Path;

/// One tensor of an output (or example) file.
pub(super) struct Out {
    pub(super) name: &'static str,
    pub(super) dtype: StDtype,
    pub(super) shape: Vec<usize>,
    pub(super) data: Vec<u8>,
}

/// The name of the statistics tensor: `lse` for the softmax-like families, `den` for Taylor.
pub(super) fn stats_name(spec: &AttnSpec) -> &'static str {
    if spec.family().is_softmax_like() {
        "lse"
    } else {
        "den"
    }
}

/// The output tensors of a forward (and backward) in the file's layout.
pub(super) fn outputs<E: Stored>(spec: &AttnSpec, f: &Forward<E, f32>, g: Option<&Gradients<E>>) -> Vec<Out> {
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

/// `outs` as a safetensors file (`path` names it in errors).
pub(super) fn serialize(
    path: &Path,
    outs: &[Out],
    metadata: HashMap<String, String>,
) -> Result<Vec<u8>, BenchError> {
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
pub(super) fn write_file(
    path: &Path,
    outs: &[Out],
    metadata: HashMap<String, String>,
) -> Result<(), BenchError> {
    write_bytes(path, &serialize(path, outs, metadata)?)
}

/// Write `bytes` to `path`, creating its folder if missing.
pub(super) fn write_bytes(path: &Path, bytes: &[u8]) -> Result<(), BenchError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
    }
    std::fs::write(path, bytes).map_err(|e| BenchError::io(path, e))
}

pub(super) fn tensor_lines(outs: &[Out]) -> Vec<String> {
    outs.iter()
        .map(|o| format!("{} {:?} {}", o.name, o.dtype, shape_str(&o.shape)))
        .collect()
}
