//! The instruction set the fast path's own loops run with (the score epilogue, row max, `exp`,
//! row sums, rescaling): the GEMMs dispatch by themselves inside the `gemm` crate, but this crate
//! is compiled for the target's baseline (SSE2 on x86-64: 4 f32 lanes), which left those loops
//! at a quarter of an AVX-512 core's width.
//!
//! Each hot kernel (a forward task, a backward tile) has one body, `#[inline(always)]`, compiled
//! three times on x86-64: as is, inside an `avx2,fma` function and inside an AVX-512 function;
//! [`Level::detect`] picks one at run time (`is_x86_feature_detected!`, cached by std). Other
//! targets (aarch64: NEON is their baseline) run the body as is.
//!
//! The bodies use no explicit fused multiply-add and Rust never contracts `a * b + c`, and every
//! reduction is written over a fixed number of lanes ([`LANES`]), so each level performs the same
//! IEEE operations in the same order: the levels give bit-identical results (tested in
//! `fast::tests`), and the portable body stays covered on an AVX machine.

/// Lanes of the explicit partial reductions (max, sum): one AVX-512 register of f32.
pub(super) const LANES: usize = 16;

/// The instruction set a kernel body is compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Level {
    /// The target's baseline.
    Portable,
    /// x86-64 with AVX2 and FMA (x86-64-v3).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// x86-64 with AVX-512 F/BW/DQ/VL (x86-64-v4).
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Level {
    /// The widest level this CPU runs.
    pub(super) fn detect() -> Level {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl") {
                return Level::Avx512;
            }
            if has!("avx2") && has!("fma") {
                return Level::Avx2;
            }
        }
        Level::Portable
    }

    /// Every level this CPU runs, the portable one first.
    #[cfg(test)]
    pub(super) fn available() -> Vec<Level> {
        let mut out = vec![Level::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            let best = Level::detect();
            if best != Level::Portable {
                out.push(Level::Avx2);
            }
            if best == Level::Avx512 {
                out.push(Level::Avx512);
            }
        }
        out
    }
}

/// Define `$name(level, args…)`, which runs the `#[inline(always)]` function `$body(args…)`
/// compiled for `level` (see the module doc). `level` must come from [`Level::detect`] or
/// [`Level::available`]: the wrappers' safety rests on the CPU having its features.
macro_rules! multiversion {
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident<$($g:ident: $bound:path),*>($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty => $body:ident;
    ) => {
        $(#[$meta])*
        $vis fn $name<$($g: $bound),*>(level: $crate::fast::simd::Level, $($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            fn avx2<$($g: $bound),*>($($arg: $ty),*) -> $ret {
                $body($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
            fn avx512<$($g: $bound),*>($($arg: $ty),*) -> $ret {
                $body($($arg),*)
            }
            match level {
                $crate::fast::simd::Level::Portable => $body($($arg),*),
                // SAFETY: `Level::detect` returns Avx2 only where the CPU has AVX2 and FMA.
                #[cfg(target_arch = "x86_64")]
                $crate::fast::simd::Level::Avx2 => unsafe { avx2($($arg),*) },
                // SAFETY: `Level::detect` returns Avx512 only where the CPU has these features.
                #[cfg(target_arch = "x86_64")]
                $crate::fast::simd::Level::Avx512 => unsafe { avx512($($arg),*) },
            }
        }
    };
}
pub(super) use multiversion;

/// `max(x)` ignoring NaN (−∞ for an empty or all-NaN slice), over [`LANES`] partial maxima.
#[inline(always)]
pub(super) fn max_ignoring_nan(x: &[f32]) -> f32 {
    let pick = |a: f32, b: f32| if b > a { b } else { a };
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |a, &b| pick(a, b));
    for c in chunks {
        for l in 0..LANES {
            acc[l] = pick(acc[l], c[l]);
        }
    }
    acc.iter().fold(tail, |a, &b| pick(a, b))
}

/// `x ← e^(x − m)` in place and `Σ x` after, over [`LANES`] partial sums.
#[inline(always)]
pub(super) fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
    let mut acc = [0f32; LANES];
    let mut chunks = x.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            let p = super::tile::exp(c[l] - m);
            c[l] = p;
            acc[l] += p;
        }
    }
    let mut tail = 0f32;
    for v in chunks.into_remainder() {
        *v = super::tile::exp(*v - m);
        tail += *v;
    }
    acc.iter().sum::<f32>() + tail
}

/// `a·b` over `2·`[`LANES`] partial sums (two independent chains of vector adds).
#[inline(always)]
pub(super) fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    const W: usize = 2 * LANES;
    let mut acc = [0f32; W];
    let (ca, cb) = (a.chunks_exact(W), b.chunks_exact(W));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..W {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}
