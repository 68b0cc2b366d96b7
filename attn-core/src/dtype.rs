//! Element types: the three storage dtypes every backend accepts.
//!
//! Storage is f32, f16 or bf16; every backend accumulates in f32 (kernels) or f64 (the CPU reference).

use half::{bf16, f16};
use std::fmt;

/// Storage dtype of q, k, v, o and their gradients. Statistics (LSE, Taylor denominators) are always f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE single precision.
    F32,
    /// IEEE half precision (`half::f16`).
    F16,
    /// bfloat16 (`half::bf16`).
    BF16,
}

impl DType {
    /// The three dtypes, in the order f32, f16, bf16.
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// Unit roundoff (half the distance from 1 to the next representable number).
    pub fn unit_roundoff(self) -> f64 {
        match self {
            DType::F32 => f32::EPSILON as f64 / 2.0,
            DType::F16 => 2f64.powi(-11),
            DType::BF16 => 2f64.powi(-8),
        }
    }

    /// `f32`, `f16` or `bf16`; [`std::str::FromStr`] parses the same names.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(DType::F32),
            "f16" => Ok(DType::F16),
            "bf16" => Ok(DType::BF16),
            other => Err(format!("unknown dtype `{other}` (expected f32, f16 or bf16)")),
        }
    }
}

/// A host element type: one of f32, f16, bf16.
pub trait Element: Copy + Send + Sync + Default + PartialEq + fmt::Debug + 'static {
    /// The [`DType`] of this element type.
    const DTYPE: DType;
    /// Widen to f64 (exact).
    fn to_f64(self) -> f64;
    /// Round to nearest.
    fn from_f64(x: f64) -> Self;
    /// Widen to f32 (exact for f16 and bf16).
    fn to_f32(self) -> f32;
    /// Round to nearest.
    fn from_f32(x: f32) -> Self;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    fn from_f64(x: f64) -> Self {
        f16::from_f64(x)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
}

impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
    fn from_f64(x: f64) -> Self {
        bf16::from_f64(x)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
}

/// Round an f64 through the element type `E` and back.
pub fn round_to<E: Element>(x: f64) -> f64 {
    E::from_f64(x).to_f64()
}
