//! Typed errors. Every error names the op (family and pass), the argument and, where shapes are
//! involved, the expected and actual shapes.

use std::fmt;

/// Which attention family an op belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FamilyKind {
    /// Softmax attention (docs/math.md §1).
    Softmax,
    /// Cosine-similarity attention (docs/math.md §2).
    CosineSim,
    /// Taylor linear attention (docs/math.md §3).
    Taylor,
    /// Hyperbolic attention on the Lorentz hyperboloid (docs/math.md §4).
    Hyperbolic,
}

impl FamilyKind {
    /// The family's name in messages: `softmax`, `cosine_sim`, `taylor` or `hyperbolic`.
    pub fn name(self) -> &'static str {
        match self {
            FamilyKind::Softmax => "softmax",
            FamilyKind::CosineSim => "cosine_sim",
            FamilyKind::Taylor => "taylor",
            FamilyKind::Hyperbolic => "hyperbolic",
        }
    }
}

/// The step of a call in which an error arose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pass {
    /// Turning user input into a checked [`crate::AttnSpec`]; displayed as `attention`, so that
    /// e.g. `softmax attention: invalid `scale`` names what the user called.
    Spec,
    /// The forward pass (o and its statistics).
    Forward,
    /// The backward pass (dq, dk, dv and dbias).
    Backward,
    /// A recurrent decode step ([`crate::DecodeShape`]).
    Decode,
}

/// The op an error belongs to, displayed as e.g. `softmax forward` or, for the checks of a
/// call's arguments, `softmax attention`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Op {
    /// The family of the call.
    pub family: FamilyKind,
    /// The step of the call.
    pub pass: Pass,
}

impl Op {
    /// The op of `family` in `pass`.
    pub fn new(family: FamilyKind, pass: Pass) -> Self {
        Op { family, pass }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pass = match self.pass {
            Pass::Spec => "attention",
            Pass::Forward => "forward",
            Pass::Backward => "backward",
            Pass::Decode => "decode",
        };
        write!(f, "{} {}", self.family.name(), pass)
    }
}

/// Every error of the library. Its message starts with the op (`softmax forward: ...`) and names the
/// argument; shape errors give the expected and the actual shape.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AttnError {
    /// A tensor or buffer does not have the shape (or length) the spec requires.
    #[error("{op}: `{what}` has the wrong shape: expected {expected}, got {got}")]
    ShapeMismatch {
        /// The op that checked the shape.
        op: Op,
        /// The tensor or buffer, e.g. `k` or `bias`.
        what: String,
        /// The shape the spec requires, e.g. `[2, 128, 8, 64]`.
        expected: String,
        /// The shape that was passed.
        got: String,
    },
    /// A scalar or structural argument is out of its domain.
    #[error("{op}: invalid `{arg}`: {reason}")]
    InvalidArgument {
        /// The op that checked the argument.
        op: Op,
        /// The argument's name, e.g. `scale`.
        arg: &'static str,
        /// Why the value is out of its domain.
        reason: String,
    },
    /// A valid combination that this backend does not implement.
    #[error("{op}: unsupported by {backend}: {what}")]
    Unsupported {
        /// The op that was asked for.
        op: Op,
        /// The backend's name, e.g. `attn-cuda`.
        backend: &'static str,
        /// The option, dtype or shape it lacks.
        what: String,
    },
    /// A size, stride, buffer length or offset derived from the arguments overflows `usize`, exceeds
    /// `isize::MAX` bytes, or exceeds the index width of the kernels' parameters (32-bit sizes,
    /// sequence offsets and window bounds, 64-bit strides).
    #[error("{op}: `{arg}` is too large for {shapes}: {reason}")]
    TooLarge {
        /// The operation that was asked for.
        op: Op,
        /// The argument whose value (or whose product with the others) is too large.
        arg: &'static str,
        /// The call's sizes: batch, heads, sequence lengths and head dims.
        shapes: String,
        /// Which limit it exceeds.
        reason: String,
    },
    /// A failure inside a backend (driver error, out of memory, ...).
    #[error("{op}: {backend} failed: {message}")]
    Backend {
        /// The op that failed.
        op: Op,
        /// The backend's name.
        backend: &'static str,
        /// The backend's own message.
        message: String,
    },
}

impl AttnError {
    /// The op the error belongs to.
    pub fn op(&self) -> Op {
        match self {
            AttnError::ShapeMismatch { op, .. }
            | AttnError::InvalidArgument { op, .. }
            | AttnError::Unsupported { op, .. }
            | AttnError::TooLarge { op, .. }
            | AttnError::Backend { op, .. } => *op,
        }
    }
}

/// `std::result::Result` with [`AttnError`] as the default error.
pub type Result<T, E = AttnError> = std::result::Result<T, E>;

/// Format a shape as `[a, b, c]`.
pub fn shape_str(dims: &[usize]) -> String {
    let parts: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}
