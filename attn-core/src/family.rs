//! The four attention families and their parameters (docs/math.md §1–4).
//!
//! [`Family`] is what a user writes; [`FamilySpec`] is the checked form with every default resolved,
//! which is all a backend ever sees.

use crate::error::FamilyKind;

/// Default l2-normalisation epsilon: `x̂ = x / max(‖x‖, eps)`.
pub const DEFAULT_L2_EPS: f32 = 1e-6;

/// Geodesic scores clamp the arccosh argument at `z ≥ 1 + ACOSH_EPS`; below it the distance is
/// taken as `arccosh(1 + ACOSH_EPS)` and its gradient as zero (docs/math.md §4). Shared by the CPU
/// reference and the kernels so both clamp identically.
pub const ACOSH_EPS: f64 = 1e-6;

/// Einstein-midpoint values must lie in the Klein ball `c‖v‖² < 1`. We clamp instead of failing on
/// data: `γ_j = 1/√(1 − min(c‖v_j‖², KLEIN_MAX_NORM2))`, with zero gradient through γ where the
/// clamp is active. Shared by the CPU reference and the kernels so both clamp identically.
pub const KLEIN_MAX_NORM2: f64 = 1.0 - 1e-5;

/// Curvatures `c` the squared Lorentz score accepts, inclusive. Backends form `1/c` (the time
/// coordinate `x0 = √(1/c + ‖x‖²)`) and the statistic's constant `2β/c` in f32; inside this range
/// `1/c` and `c` stay normal f32 numbers with a margin of 10²⁶ on either side, and
/// [`AttnProblem::validate`](crate::AttnProblem::validate) also requires `2β/c` (and `2β·log2 e`,
/// the exponent's factor) to be finite in f32. Outside it a typed error names `curvature`.
pub const SQ_LORENTZ_CURVATURE: (f32, f32) = (1e-12, 1e12);

/// Softmax attention (FlashAttention, docs/math.md §1): `s = scale·q·k` (optionally
/// `softcap·tanh(s/softcap)`) + bias. The default is `scale = 1/√D`, no softcap.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct SoftmaxParams {
    /// Score scale; `None` (the default) means `1/√D`. Must be finite.
    pub scale: Option<f32>,
    /// `Some(c)` caps the scores as `c·tanh(s/c)` (c > 0); `None` (the default) leaves them as they are.
    pub softcap: Option<f32>,
}

/// Cosine-similarity attention (docs/math.md §2): `s = scale·q̂·k̂` with a fixed scale and no running
/// max. The default is `scale = 10`, `qk_l2norm = true`, `eps = DEFAULT_L2_EPS`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CosineParams {
    /// Fixed score scale (default 10). Because `|q̂·k̂| ≤ 1` the scores are at most `scale`, which
    /// the weights subtract instead of a running max.
    pub scale: f32,
    /// l2-normalise q and k before the scores (default `true`). With `false` the scores are
    /// unbounded and the backends keep a running max, as softmax does.
    pub qk_l2norm: bool,
    /// `x̂ = x / max(‖x‖, eps)` (default [`DEFAULT_L2_EPS`]).
    pub eps: f32,
}

impl Default for CosineParams {
    fn default() -> Self {
        CosineParams {
            scale: 10.0,
            qk_l2norm: true,
            eps: DEFAULT_L2_EPS,
        }
    }
}

/// Taylor ("Fastmax") linear attention (docs/math.md §3): `w = a0 + a1·s + a2·s²` (order 2) or
/// `a0 + a1·s` (order 1). The default is order 2, `a = [1, 1, 1/2]` (the Taylor series of exp),
/// `scale = 1/√D`, no l2-normalisation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TaylorParams {
    /// 1 or 2 (default 2); anything else is rejected by validation.
    pub order: u8,
    /// `[a0, a1, a2]` (default `[1, 1, 0.5]`); `a2` is ignored for order 1. Validation rejects
    /// non-finite coefficients, order 1 with `a0 = a1 = 0` (every weight 0), and order 2 unless
    /// `a2 > 0` and `a0 − a1²/(4·a2) > 0` (f > 0 everywhere). For order 1 keep `a0 + a1·s` one sign
    /// over the scores: `a0 > 0` and `|a1|·max|s| < a0` (`a1` of either sign).
    pub a: [f32; 3],
    /// Score scale; `None` (the default) means `1/√D`.
    pub scale: Option<f32>,
    /// l2-normalise q and k (with [`DEFAULT_L2_EPS`]) before the scores (default `false`). Order 1
    /// is normally used with `true` and `scale ≤ 1`, where `a0 + a1·s > 0`.
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

/// Hyperbolic attention in the Lorentz model of curvature `−c` (docs/math.md §4). A row `x` of q or
/// k is the space part of the hyperboloid point `(√(1/c + ‖x‖²), x)`. The default is
/// `SquaredLorentz` scores, `c = 1`, `β = 1`, `Euclidean` aggregation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HyperbolicParams {
    /// The score function (default [`HypScore::SquaredLorentz`]).
    pub score: HypScore,
    /// `c > 0` of the curvature `−c` (default 1). The squared Lorentz score takes `c` in
    /// [`SQ_LORENTZ_CURVATURE`] with `2β/c` finite in f32.
    pub curvature: f32,
    /// `β > 0`, the inverse temperature of the scores `s = −β·d` (default 1).
    pub beta: f32,
    /// How the values are combined (default [`Aggregation::Euclidean`]).
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
    /// Softmax attention (docs/math.md §1).
    Softmax(SoftmaxParams),
    /// Cosine-similarity attention (docs/math.md §2).
    CosineSim(CosineParams),
    /// Taylor linear attention (docs/math.md §3).
    Taylor(TaylorParams),
    /// Hyperbolic attention (docs/math.md §4).
    Hyperbolic(HyperbolicParams),
}

impl Family {
    /// The family without its parameters, as errors name it.
    pub fn kind(&self) -> FamilyKind {
        match self {
            Family::Softmax(_) => FamilyKind::Softmax,
            Family::CosineSim(_) => FamilyKind::CosineSim,
            Family::Taylor(_) => FamilyKind::Taylor,
            Family::Hyperbolic(_) => FamilyKind::Hyperbolic,
        }
    }

    /// Softmax with the default [`SoftmaxParams`].
    pub fn softmax() -> Self {
        Family::Softmax(SoftmaxParams::default())
    }
    /// Cosine-similarity with the default [`CosineParams`].
    pub fn cosine_sim() -> Self {
        Family::CosineSim(CosineParams::default())
    }
    /// Taylor of `order` (1 or 2, checked by validation), other parameters the default [`TaylorParams`].
    pub fn taylor(order: u8) -> Self {
        Family::Taylor(TaylorParams {
            order,
            ..TaylorParams::default()
        })
    }
    /// Hyperbolic with `score` and `aggregation`, other parameters the default [`HyperbolicParams`].
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
    /// `f(s) = a0 + a1·s`: states of `1 + D` features per key.
    One,
    /// `f(s) = a0 + a1·s + a2·s²`: states of `1 + D + D(D+1)/2` features per key.
    Two,
}

impl TaylorOrder {
    /// 1 or 2.
    pub fn as_u8(self) -> u8 {
        match self {
            TaylorOrder::One => 1,
            TaylorOrder::Two => 2,
        }
    }
}

/// The checked family: every default resolved, every parameter in its domain. The fields mean what
/// they mean in [`SoftmaxParams`], [`CosineParams`], [`TaylorParams`] and [`HyperbolicParams`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FamilySpec {
    /// Softmax attention.
    Softmax {
        /// Score scale, resolved (`1/√D` when the user gave none).
        scale: f32,
        /// `Some(c)`: scores capped as `c·tanh(s/c)`.
        softcap: Option<f32>,
    },
    /// Cosine-similarity attention.
    CosineSim {
        /// Fixed score scale.
        scale: f32,
        /// Whether q and k are l2-normalised before the scores.
        qk_l2norm: bool,
        /// `x̂ = x / max(‖x‖, eps)`.
        eps: f32,
    },
    /// Taylor linear attention.
    Taylor {
        /// Polynomial order.
        order: TaylorOrder,
        /// `[a0, a1, a2]`, with `a2 = 0` for order 1.
        a: [f32; 3],
        /// Score scale, resolved (`1/√D` when the user gave none).
        scale: f32,
        /// Whether q and k are l2-normalised before the scores.
        qk_l2norm: bool,
        /// The l2-normalisation epsilon, [`DEFAULT_L2_EPS`].
        eps: f32,
    },
    /// Hyperbolic attention.
    Hyperbolic {
        /// The score function.
        score: HypScore,
        /// `c > 0` of the curvature `−c`.
        curvature: f32,
        /// `β > 0` of the scores `s = −β·d`.
        beta: f32,
        /// How the values are combined.
        aggregation: Aggregation,
    },
}

impl FamilySpec {
    /// The family without its parameters, as errors name it.
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
