//! Typed errors. Every error names the op (family and pass), the argument and, where shapes are
//! involved, the expected and actual shapes.

use std::fmt;

/// Which attention family an op belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FamilyKind {
    Softmax,
    CosineSim,
    Taylor,
    Hyperbolic,
}

impl FamilyKind {
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
    /// Turning user input into a checked [`crate::AttnSpec`].
    Spec,
    Forward,
    Backward,
    Decode,
}

/// The op an error belongs to, displayed as e.g. `softmax forward`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Op {
    pub family: FamilyKind,
    pub pass: Pass,
}

impl Op {
    pub fn new(family: FamilyKind, pass: Pass) -> Self {
        Op { family, pass }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pass = match self.pass {
            Pass::Spec => "spec",
            Pass::Forward => "forward",
            Pass::Backward => "backward",
            Pass::Decode => "decode",
        };
        write!(f, "{} {}", self.family.name(), pass)
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AttnError {
    /// A tensor or buffer does not have the shape (or length) the spec requires.
    #[error("{op}: `{what}` has the wrong shape: expected {expected}, got {got}")]
    ShapeMismatch {
        op: Op,
        what: String,
        expected: String,
        got: String,
    },
    /// A scalar or structural argument is out of its domain.
    #[error("{op}: invalid `{arg}`: {reason}")]
    InvalidArgument {
        op: Op,
        arg: &'static str,
        reason: String,
    },
    /// A valid combination that this backend does not implement.
    #[error("{op}: unsupported by {backend}: {what}")]
    Unsupported {
        op: Op,
        backend: &'static str,
        what: String,
    },
    /// A size, stride, buffer length or offset derived from the arguments overflows `usize`, exceeds
    /// `isize::MAX` bytes, or exceeds the index width of the kernels' parameters (32-bit sizes,
    /// sequence offsets and window bounds, 64-bit strides).
    #[error("{op}: `{arg}` is too large for {shapes}: {reason}")]
    TooLarge {
        op: Op,
        arg: &'static str,
        shapes: String,
        reason: String,
    },
    /// A failure inside a backend (driver error, out of memory, ...).
    #[error("{op}: {backend} failed: {message}")]
    Backend {
        op: Op,
        backend: &'static str,
        message: String,
    },
}

impl AttnError {
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

pub type Result<T, E = AttnError> = std::result::Result<T, E>;

/// Format a shape as `[a, b, c]`.
pub fn shape_str(dims: &[usize]) -> String {
    let parts: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}
