//! Family parameters from the command line, checked against the family they apply to.

use super::*;

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
