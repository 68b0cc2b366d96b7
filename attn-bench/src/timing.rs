//! Timing statistics of repeated runs: median, minimum and interquartile spread.
//!
//! Each timed run is measured on its own (`std::time::Instant` on the CPU) after a warm-up; the
//! median is the headline number, the minimum the best case, and the spread `p75 − p25` says how
//! noisy the machine was. Percentiles interpolate linearly between order statistics.

use std::time::Instant;

/// How many runs to do per point.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TimingConfig {
    /// Untimed runs first (caches, allocator, thread pool).
    pub warmup: usize,
    /// Timed runs; each is one sample.
    pub runs: usize,
}

impl Default for TimingConfig {
    fn default() -> Self {
        TimingConfig { warmup: 3, runs: 30 }
    }
}

/// Summary of the timed runs of one point, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// `p75 − p25`.
    pub spread: f64,
    pub runs: usize,
}

/// The `q`-quantile (0 ≤ q ≤ 1) of sorted samples, interpolating linearly.
///
/// ```
/// use attn_bench::timing::quantile;
/// assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 0.5), 2.5);
/// assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.25), 2.0);
/// ```
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let pos = q.clamp(0.0, 1.0) * (n - 1) as f64;
            let lo = pos.floor() as usize;
            let hi = (lo + 1).min(n - 1);
            sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
        }
    }
}

/// Summarise samples (ms); `None` for no samples or a non-finite one.
///
/// ```
/// use attn_bench::timing::summarize;
/// let s = summarize(&[3.0, 1.0, 2.0, 5.0, 4.0]).unwrap();
/// assert_eq!((s.median, s.min, s.max, s.spread, s.runs), (3.0, 1.0, 5.0, 2.0, 5));
/// ```
pub fn summarize(samples_ms: &[f64]) -> Option<Stats> {
    if samples_ms.is_empty() || samples_ms.iter().any(|x| !x.is_finite()) {
        return None;
    }
    let mut s = samples_ms.to_vec();
    s.sort_by(f64::total_cmp);
    Some(Stats {
        median: quantile(&s, 0.5),
        min: s[0],
        max: s[s.len() - 1],
        spread: quantile(&s, 0.75) - quantile(&s, 0.25),
        runs: s.len(),
    })
}

/// Run `f` `warmup` times untimed, then `runs` times timed; the first error stops the measurement.
pub fn time_runs<E>(cfg: TimingConfig, mut f: impl FnMut() -> Result<(), E>) -> Result<Vec<f64>, E> {
    for _ in 0..cfg.warmup {
        f()?;
    }
    let mut samples = Vec::with_capacity(cfg.runs);
    for _ in 0..cfg.runs {
        let t = Instant::now();
        f()?;
        samples.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_ignore_sample_order() {
        let a = summarize(&[5.0, 1.0, 4.0, 2.0, 3.0, 10.0]).expect("samples");
        let b = summarize(&[10.0, 3.0, 2.0, 4.0, 1.0, 5.0]).expect("samples");
        assert_eq!(a, b);
        assert_eq!(a.median, 3.5);
        assert_eq!(a.min, 1.0);
        assert_eq!(a.max, 10.0);
        // p25 = 2.25, p75 = 4.75.
        assert_eq!(a.spread, 2.5);
    }

    #[test]
    fn bad_samples_give_no_stats() {
        assert_eq!(summarize(&[]), None);
        assert_eq!(summarize(&[1.0, f64::NAN]), None);
    }

    #[test]
    fn time_runs_counts_and_stops_on_error() {
        let mut calls = 0;
        let s = time_runs::<()>(TimingConfig { warmup: 2, runs: 5 }, || {
            calls += 1;
            Ok(())
        })
        .expect("no error");
        assert_eq!((s.len(), calls), (5, 7));
        let mut calls = 0;
        let r = time_runs(TimingConfig { warmup: 1, runs: 5 }, || {
            calls += 1;
            if calls == 3 {
                Err("boom")
            } else {
                Ok(())
            }
        });
        assert_eq!((r, calls), (Err("boom"), 3));
    }
}
