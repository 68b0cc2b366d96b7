//! `attn-cpu-fast`: attn-cpu-ref's f32-accumulating fast path ([`attn_cpu_ref::fast`]), the one
//! attn-candle runs on CPU tensors, on storage-dtype buffers, through the reference's runner. Every
//! family (Taylor through its chunked factorised states).

use super::cpu_ref::{prepare_with, CpuFns, CpuImpl};
use super::Runner;
use crate::error::BenchError;
use crate::grid::PassKind;
use attn_core::{AttnSpec, Element};
use attn_cpu_ref::fast::{backward, forward};

/// The fast path's entry points.
struct Fast;

impl CpuImpl for Fast {
    fn fns<E: Element>() -> CpuFns<E> {
        CpuFns {
            forward: forward::<E>,
            backward: backward::<E>,
        }
    }
}

/// Set up the fast path on `spec` (seeded inputs; a backward-only pass runs its forward here).
pub fn prepare(spec: &AttnSpec, pass: PassKind, seed: u64) -> Result<Box<dyn Runner>, BenchError> {
    prepare_with::<Fast>(spec, pass, seed)
}
