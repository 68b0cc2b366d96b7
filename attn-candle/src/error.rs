//! Errors: every failure is an [`attn_core::AttnError`] (naming the op, the argument and the
//! shapes) carried inside a `candle_core::Error`, so callers keep using candle's `Result`.

use attn_core::{shape_str, AttnError, DType, FamilyKind, Op, Pass};
use candle_core::Tensor;

/// Wrap an [`AttnError`] into a candle error; its message is the `AttnError`'s.
pub fn to_candle(e: AttnError) -> candle_core::Error {
    candle_core::Error::wrap(e)
}

/// `q [2, 5, 4, 16] f32 on cpu`: how messages name a tensor.
pub(crate) fn describe(name: &str, t: &Tensor) -> String {
    format!(
        "{name} {} {:?} on {:?}",
        shape_str(t.dims()),
        t.dtype(),
        t.device().location()
    )
}

/// The attn storage dtype of a candle tensor: f32, f16 or bf16.
pub(crate) fn storage_dtype(family: FamilyKind, name: &'static str, t: &Tensor) -> Result<DType, AttnError> {
    match t.dtype() {
        candle_core::DType::F32 => Ok(DType::F32),
        candle_core::DType::F16 => Ok(DType::F16),
        candle_core::DType::BF16 => Ok(DType::BF16),
        other => Err(AttnError::InvalidArgument {
            op: Op::new(family, Pass::Spec),
            arg: name,
            reason: format!(
                "{}: dtype {other:?} is not one of f32, f16, bf16",
                describe(name, t)
            ),
        }),
    }
}

/// An error for a state the ops themselves guarantee (e.g. statistics saved by the forward); it
/// names the op so a report can find it.
pub(crate) fn internal(op: Op, message: String) -> candle_core::Error {
    to_candle(AttnError::Backend {
        op,
        backend: "attn-candle",
        message,
    })
}
