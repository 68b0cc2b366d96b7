//! The kernel configuration of a [`crate::CudaAttn`]: which kernel variants a call may take.
//!
//! [`KernelConfig::default`] is the tuned choice of every field (docs/configuration.md gives the
//! measurement behind each); the other values exist so that tests cover every kernel the crate ships
//! on one GPU (the mma.sync kernels of sm_80 on a Hopper GPU, the kernels that the default routing
//! reaches only at long sequences) and for A/B timings. [`KernelConfig::from_env`] is the default
//! with the user-facing environment switch applied; `CudaAttn::new` and `CudaAttn::with_stream` use it.

use crate::error::{CudaAttnError, Result};

/// Where a kernel variant replaces the one it competes with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Route {
    /// Never.
    Off,
    /// Where it measured faster (the field's documentation names the rule).
    #[default]
    Measured,
    /// Wherever it has a kernel for the call.
    Everywhere,
}

/// Which kernel variants the calls of a [`crate::CudaAttn`] may take. Fixed for the life of the
/// backend; two backends with different configurations may share one CUDA context.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelConfig {
    /// The Hopper kernels (sm_90a: wgmma, TMA-free warp specialisation) where the device is compute
    /// capability 9.0, the only one that runs sm_90a code. Default `true`. `false` runs the portable
    /// mma.sync kernels (the sm_80 path) on a Hopper GPU too: the tests' way of covering them there,
    /// and a fallback while a Hopper kernel is suspected (`ATTN_CUDA_PORTABLE=1`).
    pub hopper: bool,
    /// Where the fused Hopper backward (one dK/dV kernel that also adds dQ into f32 scratch by
    /// atomics; not bit-reproducible) replaces the deterministic dQ and dK/dV kernels, for calls that
    /// do not ask for `deterministic` and have no bias. Default [`Route::Measured`]: where the
    /// warp-specialised fused kernel exists (softmax, cosine-sim and the hyperbolic scores at D = 64
    /// and 128; forward+backward 0–9% faster than the two kernels on the H100). `Everywhere` adds the
    /// wgmma fused kernel (D = 128, every score); `Off` keeps the two kernels for every call.
    pub fused_backward: Route,
    /// Where the warp-specialised Hopper forward replaces the wgmma one. Default [`Route::Measured`]:
    /// D = 128 for every call, at D = 64 the geodesic score and, without a causal mask or window,
    /// cosine-sim at every length and softmax and squared Lorentz from 8192 keys
    /// (`heuristics::ws_fwd_measured_faster`). `Everywhere`: wherever it has a kernel; `Off`: never.
    pub ws_forward: Route,
    /// The warp-specialised kernels of the Hopper backward (dQ, dK/dV and the default fused kernel).
    /// Default `true`; `false` keeps the wgmma dQ and dK/dV kernels (and, having no warp-specialised
    /// fused kernel, the wgmma fused one only under [`Route::Everywhere`]).
    pub ws_backward: bool,
    /// Where Taylor order 2 runs as its quadratic form on the Hopper flash kernels instead of the
    /// factorised state kernels. Default [`Route::Measured`]: where the sequences are short enough for
    /// it to be faster (`taylor::heuristics::dense_faster`) and a forward does not take the wgmma
    /// state kernels. `Off`: the state kernels for every call; `Everywhere`: wherever it has kernels.
    pub taylor_dense: Route,
    /// Where Taylor order 2's forward (bf16, D = 64; causal where every sequence has as many queries
    /// as keys) runs on the wgmma state kernels. Default [`Route::Measured`]: from 4096 keys, 8192
    /// with a causal mask (`taylor::heuristics::wg_state_faster`). `Everywhere`: wherever they apply.
    pub taylor_wg: Route,
    /// The segment length of Taylor's causal segment kernels (order 2's causal wgmma state forward,
    /// order 1's causal forward and backward, single-pass forward included), a multiple of 128, in
    /// place of their heuristics. Default `None` (the heuristics). Tests set 128 so that short
    /// sequences span many segments and the chain of segment states has many links.
    pub taylor_causal_segment: Option<usize>,
    /// Where a softmax-like forward runs on the split-KV decode kernels (`crate::decode`: the query
    /// heads of a kv head packed as the rows of one tile, the keys split across blocks) instead of
    /// the flash kernels. Default [`Route::Measured`]: f16/bf16 calls the decode kernels support
    /// with at most `decode::plan::MEASURED_MAX_ROWS` rows (queries × group) per kv head
    /// (`decode::plan::route`). `Off`: never (A/B timings); `Everywhere`: wherever they support the
    /// call. KV-cache steps (`CudaAttn::forward_kv_cache`) always run on the decode kernels.
    pub decode: Route,
    /// The number of key chunks (S) of the decode kernels in place of their heuristic
    /// (`decode::plan::splits`), clamped to the key tiles of the call. Default `None`. Tests set it
    /// to cover every split count; a value of 0 is a [`CudaAttnError::Config`] error.
    pub decode_splits: Option<usize>,
    /// The hyperbolic scores of f16/bf16 calls on the CUDA cores with the cancellation-free
    /// Lorentz distance of the f32 kernels (`kernels/hyperbolic/hyp_simt.cuh`: only `nq − nk` and
    /// `q̂ − k̂` are differences), for points far from the origin. Default `false`: the tensor-core
    /// kernels, whose score `q·k − q0 k0` loses about `2β·u_f32·q0 k0` to cancellation, a nat or
    /// more near radius 1e3 (docs/hyperbolic.md). `true` routes every hyperbolic f16/bf16 call,
    /// forward and backward, to the SIMT kernels (no decode kernels, no fused backward); they are
    /// much slower.
    pub hyperbolic_exact: bool,
}

impl Default for KernelConfig {
    fn default() -> Self {
        KernelConfig {
            hopper: true,
            fused_backward: Route::Measured,
            ws_forward: Route::Measured,
            ws_backward: true,
            taylor_dense: Route::Measured,
            taylor_wg: Route::Measured,
            taylor_causal_segment: None,
            decode: Route::Measured,
            decode_splits: None,
            hyperbolic_exact: false,
        }
    }
}

/// The segment lengths [`KernelConfig::taylor_causal_segment`] accepts are multiples of this: the
/// wgmma state read's 128 queries per block (the order-1 causal kernels need multiples of 64).
pub(crate) const SEGMENT_QUANTUM: usize = 128;

impl KernelConfig {
    /// The configuration with only the portable kernels: [`KernelConfig::hopper`] off.
    pub fn portable() -> Self {
        KernelConfig {
            hopper: false,
            ..KernelConfig::default()
        }
    }

    /// [`KernelConfig::default`], or [`KernelConfig::portable`] where the environment sets
    /// `ATTN_CUDA_PORTABLE=1`.
    pub fn from_env() -> Self {
        Self::from_portable_var(std::env::var("ATTN_CUDA_PORTABLE").ok().as_deref())
    }

    fn from_portable_var(v: Option<&str>) -> Self {
        if v.map(str::trim) == Some("1") {
            Self::portable()
        } else {
            Self::default()
        }
    }

    /// A typed error for a field out of its range (a segment length that is not a positive multiple
    /// of 128).
    pub(crate) fn check(&self) -> Result<()> {
        if self.decode_splits == Some(0) {
            return Err(CudaAttnError::Config {
                field: "decode_splits",
                reason: "0 key chunks: at least 1".into(),
            });
        }
        if let Some(l) = self.taylor_causal_segment {
            if l == 0 || l % SEGMENT_QUANTUM != 0 {
                return Err(CudaAttnError::Config {
                    field: "taylor_causal_segment",
                    reason: format!("{l} is not a positive multiple of {SEGMENT_QUANTUM}"),
                });
            }
        }
        Ok(())
    }
}

/// The Hopper (sm_90a, wgmma) kernels a call may take: `on` where the device is compute capability
/// 9.0 (the only one that runs sm_90a code) and [`KernelConfig::hopper`]; the other fields are the
/// configuration's routing of the Hopper variants ([`KernelConfig`] documents each). `Default`: off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Hopper {
    pub on: bool,
    /// [`KernelConfig::fused_backward`].
    pub fused: Route,
    /// [`KernelConfig::ws_forward`].
    pub ws: Route,
    /// [`KernelConfig::ws_backward`].
    pub bwd_ws: bool,
    /// [`KernelConfig::taylor_dense`].
    pub taylor_dense: Route,
    /// [`KernelConfig::taylor_wg`].
    pub taylor_wg: Route,
    /// [`KernelConfig::hyperbolic_exact`] (not a Hopper kernel: every device).
    pub hyp_exact: bool,
}

impl Hopper {
    pub(crate) fn new(cc: (i32, i32), config: &KernelConfig) -> Self {
        Hopper {
            on: cc == (9, 0) && config.hopper,
            fused: config.fused_backward,
            ws: config.ws_forward,
            bwd_ws: config.ws_backward,
            taylor_dense: config.taylor_dense,
            taylor_wg: config.taylor_wg,
            hyp_exact: config.hyperbolic_exact,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_the_tuned_routing_and_portable_only_turns_hopper_off() {
        let d = KernelConfig::default();
        assert!(d.hopper && d.ws_backward && d.taylor_causal_segment.is_none());
        for r in [d.fused_backward, d.ws_forward, d.taylor_dense, d.taylor_wg] {
            assert_eq!(r, Route::Measured);
        }
        assert_eq!(KernelConfig::portable(), KernelConfig { hopper: false, ..d });
        assert_eq!(KernelConfig::from_portable_var(None), d);
        assert_eq!(KernelConfig::from_portable_var(Some("0")), d);
        assert_eq!(KernelConfig::from_portable_var(Some("yes")), d);
        assert_eq!(
            KernelConfig::from_portable_var(Some(" 1\n")),
            KernelConfig::portable()
        );
    }

    #[test]
    fn segment_lengths_are_positive_multiples_of_128() {
        let seg = |l| KernelConfig {
            taylor_causal_segment: l,
            ..KernelConfig::default()
        };
        assert!(seg(None).check().is_ok());
        assert!(seg(Some(128)).check().is_ok());
        assert!(seg(Some(1024)).check().is_ok());
        for bad in [0, 64, 200] {
            let e = seg(Some(bad)).check().expect_err("rejected");
            assert!(e.to_string().contains("taylor_causal_segment"), "{e}");
        }
        let splits = |s| KernelConfig {
            decode_splits: s,
            ..KernelConfig::default()
        };
        assert!(splits(Some(1)).check().is_ok());
        let e = splits(Some(0)).check().expect_err("rejected");
        assert!(e.to_string().contains("decode_splits"), "{e}");
    }

    #[test]
    fn hopper_kernels_only_on_compute_capability_9_0_and_not_when_turned_off() {
        let default = KernelConfig::default();
        assert!(Hopper::new((9, 0), &default).on);
        assert!(!Hopper::new((9, 0), &KernelConfig::portable()).on);
        for cc in [(8, 0), (8, 9), (10, 0), (12, 0)] {
            assert!(!Hopper::new(cc, &default).on, "{cc:?}");
        }
        let h = Hopper::new((9, 0), &default);
        assert!(h.bwd_ws);
        assert_eq!(
            (h.fused, h.ws, h.taylor_dense, h.taylor_wg),
            (Route::Measured, Route::Measured, Route::Measured, Route::Measured)
        );
        let a_b = KernelConfig {
            fused_backward: Route::Off,
            ws_forward: Route::Everywhere,
            ws_backward: false,
            taylor_dense: Route::Off,
            taylor_wg: Route::Everywhere,
            ..default
        };
        let h = Hopper::new((9, 0), &a_b);
        assert_eq!((h.fused, h.ws, h.bwd_ws), (Route::Off, Route::Everywhere, false));
        assert_eq!((h.taylor_dense, h.taylor_wg), (Route::Off, Route::Everywhere));
    }
}
