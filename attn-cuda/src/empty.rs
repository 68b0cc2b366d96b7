//! Calls with no query row or no key (a batch of 0, `seq_q = 0`, `seq_k = 0`, or packed batches of
//! such entries): their result needs no score, so the entry points write it on the host's order
//! before any kernel is chosen or launched (no zero grid, no read of an empty buffer). o and every
//! gradient are zeros, each statistic that of a row with no allowed key (LSE −∞, Taylor
//! denominator 0), the result attn-cpu-ref returns. Buffers are checked as any call's (length,
//! device); an empty buffer is never touched.

use crate::check::Checker;
use crate::error::Result;
use attn_core::AttnSpec;
use cudarc::driver::{sys, CudaStream, DevicePtrMut};

/// Whether `spec` is an empty call (no query row or no key in the whole batch).
pub(crate) fn is_empty(spec: &AttnSpec) -> bool {
    spec.total_q() == 0 || spec.total_k() == 0
}

/// The bits of the statistic of a row with no key: −∞ (f32) for the softmax-like families, 0 for
/// Taylor's denominator.
fn no_key_bits(spec: &AttnSpec) -> u32 {
    if spec.family().is_softmax_like() {
        f32::NEG_INFINITY.to_bits()
    } else {
        0
    }
}

/// Zero the first `len` elements of `buf` (checked by `c` as output `what`), on `stream`.
pub(crate) fn zero<T>(
    c: &Checker<'_>,
    stream: &CudaStream,
    what: &str,
    buf: &mut dyn DevicePtrMut<T>,
    len: usize,
) -> Result<()> {
    let (ptr, _guard) = c.output(what, buf, len)?;
    if len > 0 {
        let bytes = len * std::mem::size_of::<T>();
        // SAFETY: `c.output` checked that `buf` holds at least `len` elements on the call's device;
        // the memset is ordered on `stream`, the guard records the write for the buffer's stream.
        unsafe { cudarc::driver::result::memset_d8_async(ptr, 0, bytes, stream.cu_stream()) }?;
    }
    Ok(())
}

/// Fill the first `spec.stats_len()` elements of `stats` with the no-key statistic.
pub(crate) fn fill_stats(
    c: &Checker<'_>,
    stream: &CudaStream,
    what: &str,
    stats: &mut dyn DevicePtrMut<f32>,
) -> Result<()> {
    let len = c.spec.stats_len();
    let (ptr, _guard) = c.output(what, stats, len)?;
    if len > 0 {
        // SAFETY: as in `zero`; f32 buffers are 4-byte aligned (checked by `c.output`), as
        // cuMemsetD32 needs.
        unsafe { sys::cuMemsetD32Async(ptr, no_key_bits(c.spec), len, stream.cu_stream()) }.result()?;
    }
    Ok(())
}
