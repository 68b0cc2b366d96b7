//! The four attention families and their parameters (REFERENCE.md §1–4).
//!
//! [`Family`] is what a user writes; [`FamilySpec`] is the checked form with every default resolved,
//! which is all a backend ever sees.

use crate::error::FamilyKind;

/// Default l2-normalisation epsilon: `x̂ = x / max(‖x‖, eps)`.
pub const DEFAULT_L2_EPS: f32 = 1e-6;

/// Geodesic scores clamp the arccosh argument at `z ≥ 1 + ACOSH_EPS`; below it the distance is
/// taken as `arccosh(1 + ACOSH_EPS)` and its gradient as zero (REFERENCE.md §4). Shared by the CPU
/// reference and the kernels so both clamp identically.
pub const ACOSH_EPS: f64 = 1e-6;

/// Einstein-midpoint values must lie in the Klein ball `c‖v‖² < 1`. We clamp instead of failing on
/// data: `γ_j = 1/√(1 − min(c‖v_j‖², KLEIN_MAX_NORM2))`, with zero gradient through γ where the
/// clamp is active. Shared by the CPU reference and the kernels so both clamp identically.
pub const KLEIN_MAX_NORM2: f64 = 1.0 - 1e-5;

/// Softmax attention (FlashAttention): `s = scale·q·k` (optionally `softcap·tanh(s/softcap)`) + bias.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct SoftmaxParams {
    /// `None` means `1/√D`.
    pub scale: Option<f32>,
    pub softcap: Option<f32>,
}

/// Cosine-similarity attention: `s = scale·q̂·k̂` with a fixed scale and no running max.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CosineParams {
    pub scale: f32,
    pub l2norm_qk: bool,
    pub eps: f32,
}

impl Default for CosineParams {
    fn default() -> Self {
        CosineParams {
            scale: 10.0,
            l2norm_qk: true,
            eps: DEFAULT_L2_EPS,
        }
    }
}

/// Taylor ("Fastmax") linear attention: `w = a0 + a1·s + a2·s²` (order 2) or `a0 + a1·s` (order 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TaylorParams {
    /// 1 or 2; anything else is rejected by validation.
    pub order: u8,
    /// `[a0, a1, a2]`; `a2` is ignored for order 1.
    pub a: [f32; 3],
    /// `None` means `1/√D`.
    pub scale: Option<f32>,
    /// l2-normalise q and k (with [`DEFAULT_L2_EPS`]) before the scores.
    pub qk_l2norm: bool,
}

impl Default for TaylorParams {
    fn default() -> Self {
        TaylorParams {
            order: 2,
            a: [1.0, 1.0, 0.5],
            scale: None,
            qk_l2norm: false,
        }
    }
}

/// Score function of the hyperbolic family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HypScore {
    /// `s = −β·arccosh(−c⟨q,k⟩_L)/√c`.
    Geodesic,
    /// `s = −β·(−2/c − 2⟨q,k⟩_L)`.
    SquaredLorentz,
}

/// How the hyperbolic family combines values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Aggregation {
    /// `o = Σ w v`.
    Euclidean,
    /// `o = Σ w γ v / Σ w γ` with `γ_j = 1/√(1 − c‖v_j‖²)` (values in the Klein ball).
    EinsteinMidpoint,
}

/// Hyperbolic attention in the Lorentz model of curvature `−c`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HyperbolicParams {
    pub score: HypScore,
    pub curvature: f32,
    pub beta: f32,
    pub aggregation: Aggregation,
}

impl Default for HyperbolicParams {
    fn default() -> Self {
        HyperbolicParams {
            score: HypScore::SquaredLorentz,
            curvature: 1.0,
            beta: 1.0,
            aggregation: Aggregation::Euclidean,
        }
    }
}

/// An attention family with its parameters, as a user writes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Family {
    Softmax(SoftmaxParams),
    CosineSim(CosineParams),
    Taylor(TaylorParams),
    Hyperbolic(HyperbolicParams),
}

impl Family {
    pub fn kind(&self) -> FamilyKind {
        match self {
            Family::Softmax(_) => FamilyKind::Softmax,
            Family::CosineSim(_) => FamilyKind::CosineSim,
            Family::Taylor(_) => FamilyKind::Taylor,
            Family::Hyperbolic(_) => FamilyKind::Hyperbolic,
        }
    }

    pub fn softmax() -> Self {
        Family::Softmax(SoftmaxParams::default())
    }
    pub fn cosine_sim() -> Self {
        Family::CosineSim(CosineParams::default())
    }
    pub fn taylor(order: u8) -> Self {
        Family::Taylor(TaylorParams {
            order,
            ..TaylorParams::default()
        })
    }
    pub fn hyperbolic(score: HypScore, aggregation: Aggregation) -> Self {
        Family::Hyperbolic(HyperbolicParams {
            score,
            aggregation,
            ..HyperbolicParams::default()
        })
    }
}

/// Taylor polynomial order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaylorOrder {
    One,
    Two,
}

impl TaylorOrder {
    pub fn as_u8(self) -> u8 {
        match self {
            TaylorOrder::One => 1,
            TaylorOrder::Two => 2,
        }
    }
}

/// The checked family: every default resolved, every parameter in its domain.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FamilySpec {
    Softmax {
        scale: f32,
        softcap: Option<f32>,
    },
    CosineSim {
        scale: f32,
        l2norm_qk: bool,
        eps: f32,
    },
    Taylor {
        order: TaylorOrder,
        /// `[a0, a1, a2]`, with `a2 = 0` for order 1.
        a: [f32; 3],
        scale: f32,
        qk_l2norm: bool,
        eps: f32,
    },
    Hyperbolic {
        score: HypScore,
        curvature: f32,
        beta: f32,
        aggregation: Aggregation,
    },
}

impl FamilySpec {
    pub fn kind(&self) -> FamilyKind {
        match self {
            FamilySpec::Softmax { .. } => FamilyKind::Softmax,
            FamilySpec::CosineSim { .. } => FamilyKind::CosineSim,
            FamilySpec::Taylor { .. } => FamilyKind::Taylor,
            FamilySpec::Hyperbolic { .. } => FamilyKind::Hyperbolic,
        }
    }

    /// True for the families whose weights are a softmax over scores (all but Taylor): they save an
    /// LSE per row, take masks of any shape and an additive bias.
    pub fn is_softmax_like(&self) -> bool {
        !matches!(self, FamilySpec::Taylor { .. })
    }

    /// A short stable name used in benchmark rows and test names, e.g. `taylor2`,
    /// `hyperbolic_geodesic`.
    pub fn label(&self) -> &'static str {
        match self {
            FamilySpec::Softmax { .. } => "softmax",
            FamilySpec::CosineSim { .. } => "cosine_sim",
            FamilySpec::Taylor {
                order: TaylorOrder::One,
                ..
            } => "taylor1",
            FamilySpec::Taylor {
                order: TaylorOrder::Two,
                ..
            } => "taylor2",
            FamilySpec::Hyperbolic {
                score: HypScore::Geodesic,
                ..
            } => "hyperbolic_geodesic",
            FamilySpec::Hyperbolic {
                score: HypScore::SquaredLorentz,
                ..
            } => "hyperbolic_sq_lorentz",
        }
    }
}
