//! How far a device's outputs are from the f64 reference: per tensor, the largest absolute
//! difference, set beside the largest reference value and the error of rounding the reference
//! itself to the storage dtype (what `check --device cpu` writes), so the figure can be read
//! without a tolerance table.
//!
//! Non-finite values are compared as values: an element equal to the reference (a fully masked
//! row's LSE of −∞ on both sides) counts as no error; a NaN or infinity where the reference has
//! something else makes the difference infinite and is counted.

use std::fmt;

/// One output or gradient of the device against the f64 reference.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// The tensor's name in the output file (`o`, `lse`, `den`, `dq`, ...).
    pub name: &'static str,
    /// `max |device − reference|` over the elements; infinite when [`Comparison::not_finite`] > 0.
    pub max_abs_diff: f64,
    /// `max |reference|` over the finite reference elements.
    pub max_abs_reference: f64,
    /// `max |round(reference) − reference|`: the reference rounded once to the tensor's storage
    /// dtype, the smallest error any implementation that stores this dtype can have.
    pub rounding: f64,
    /// Elements that differ from the reference and are not finite (or whose reference is not).
    pub not_finite: usize,
    /// The storage dtype's name, for the message.
    pub dtype: &'static str,
}

/// Compare `got` with `reference` element by element; `round` rounds an f64 to the storage dtype.
///
/// ```
/// use attn_bench::check::compare::compare;
/// let reference = [1.0, -0.5, f64::NEG_INFINITY];
/// let got = [1.001, -0.5, f64::NEG_INFINITY];
/// let c = compare("lse", &got, &reference, "f32", |x| x as f32 as f64);
/// assert!((c.max_abs_diff - 1e-3).abs() < 1e-12);
/// assert_eq!((c.max_abs_reference, c.not_finite), (1.0, 0));
/// let c = compare("o", &[f64::NAN, 0.0], &[0.25, 0.0], "f32", |x| x);
/// assert_eq!((c.max_abs_diff, c.not_finite), (f64::INFINITY, 1));
/// ```
pub fn compare(
    name: &'static str,
    got: &[f64],
    reference: &[f64],
    dtype: &'static str,
    round: impl Fn(f64) -> f64,
) -> Comparison {
    let mut c = Comparison {
        name,
        max_abs_diff: 0.0,
        max_abs_reference: 0.0,
        rounding: 0.0,
        not_finite: 0,
        dtype,
    };
    // A length mismatch is an implementation bug, never silently ignored: every missing element
    // counts as not finite.
    c.not_finite += got.len().abs_diff(reference.len());
    for (&g, &r) in got.iter().zip(reference) {
        if r.is_finite() {
            c.max_abs_reference = c.max_abs_reference.max(r.abs());
            c.rounding = c.rounding.max((round(r) - r).abs());
        }
        if g == r {
            continue;
        }
        if g.is_finite() && r.is_finite() {
            c.max_abs_diff = c.max_abs_diff.max((g - r).abs());
        } else {
            c.not_finite += 1;
        }
    }
    if c.not_finite > 0 {
        c.max_abs_diff = f64::INFINITY;
    }
    c
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: max |attn-cuda − f64 reference| {:.3e} (largest |reference| {:.3e}; the reference rounded to {} is off by {:.3e})",
            self.name, self.max_abs_diff, self.max_abs_reference, self.dtype, self.rounding
        )?;
        if self.not_finite > 0 {
            write!(
                f,
                "; {} elements are not finite or missing where the reference has a value",
                self.not_finite
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_tensors_have_no_error_and_report_the_rounding_of_the_reference() {
        let reference = [0.1, -0.3, 2.0];
        let c = compare("o", &reference, &reference, "bf16", |x| {
            attn_core::bf16::from_f64(x).to_f64()
        });
        assert_eq!(c.max_abs_diff, 0.0);
        assert_eq!(c.max_abs_reference, 2.0);
        assert!(c.rounding > 0.0 && c.rounding < 2e-3, "{}", c.rounding);
        assert_eq!(c.not_finite, 0);
        assert!(
            c.to_string()
                .starts_with("o: max |attn-cuda − f64 reference| 0.000e0"),
            "{c}"
        );
    }

    #[test]
    fn infinities_match_only_themselves() {
        let reference = [f64::NEG_INFINITY, 1.0];
        let c = compare("lse", &[f64::NEG_INFINITY, 1.5], &reference, "f32", |x| x);
        assert_eq!((c.max_abs_diff, c.not_finite), (0.5, 0));
        let c = compare("lse", &[0.0, 1.0], &reference, "f32", |x| x);
        assert_eq!((c.max_abs_diff, c.not_finite), (f64::INFINITY, 1));
        assert!(c.to_string().contains("1 elements are not finite"), "{c}");
    }

    #[test]
    fn a_short_output_counts_its_missing_elements() {
        let c = compare("dq", &[1.0], &[1.0, 2.0, 3.0], "f32", |x| x);
        assert_eq!((c.max_abs_diff, c.not_finite), (f64::INFINITY, 2));
    }
}
