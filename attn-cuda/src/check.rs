//! The checks every call makes on its device buffers (length against the spec, device, alignment),
//! and the guards that order their use on the call's stream: one checker for every kernel family.

use crate::dispatch;
use crate::error::Result;
use attn_core::{AttnError, AttnSpec, Op, Pass};
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};

/// Per-call checks on device buffers, and the guards that order their use on our stream.
pub(crate) struct Checker<'s> {
    pub spec: &'s AttnSpec,
    pub op: Op,
    pub pass: Pass,
    pub stream: &'s CudaStream,
    /// The flash kernels' tensor-core path: q, k, v, o and dO 16-byte aligned (cp.async), outputs
    /// 4-byte aligned (paired 16-bit stores). Otherwise (f32, and Taylor's state kernels, which route
    /// by the rows' alignment themselves) element alignment.
    pub tensor_cores: bool,
}

impl<'s> Checker<'s> {
    /// A buffer whose stream is `stream` lives on the call's device.
    fn device(&self, what: &str, stream: &CudaStream) -> Result<()> {
        if stream.context().cu_ctx() != self.stream.context().cu_ctx() {
            return Err(AttnError::InvalidArgument {
                op: self.op,
                arg: "device",
                reason: format!(
                    "`{what}` lives on CUDA device {} but the call runs on device {}",
                    stream.context().ordinal(),
                    self.stream.context().ordinal()
                ),
            }
            .into());
        }
        Ok(())
    }

    fn aligned(&self, what: &str, ptr: u64, align: u64) -> Result<()> {
        if ptr % align != 0 {
            return Err(AttnError::Unsupported {
                op: self.op,
                backend: dispatch::BACKEND,
                what: format!("`{what}` at device address {ptr:#x}, not {align}-byte aligned"),
            }
            .into());
        }
        Ok(())
    }

    /// A read buffer: length, device, alignment; returns its address and the ordering guard.
    pub(crate) fn input<'a, T>(
        &self,
        what: &str,
        buf: &'a dyn DevicePtr<T>,
        need: usize,
    ) -> Result<(u64, SyncOnDrop<'a>)>
    where
        's: 'a,
    {
        self.spec.check_len(self.pass, what, buf.len(), need)?;
        self.device(what, buf.stream())?;
        let (ptr, guard) = buf.device_ptr(self.stream);
        let align = if self.tensor_cores && matches!(what, "q" | "k" | "v" | "o" | "d_o") {
            16
        } else {
            std::mem::size_of::<T>() as u64
        };
        self.aligned(what, ptr, align)?;
        Ok((ptr, guard))
    }

    /// A written buffer.
    pub(crate) fn output<'a, T>(
        &self,
        what: &str,
        buf: &'a mut dyn DevicePtrMut<T>,
        need: usize,
    ) -> Result<(u64, SyncOnDrop<'a>)>
    where
        's: 'a,
    {
        self.spec.check_len(self.pass, what, buf.len(), need)?;
        self.device(what, buf.stream())?;
        let (ptr, guard) = buf.device_ptr_mut(self.stream);
        // Paired 2-element stores for f16/bf16 rows.
        let align = if self.tensor_cores {
            4
        } else {
            std::mem::size_of::<T>() as u64
        };
        self.aligned(what, ptr, align)?;
        Ok((ptr, guard))
    }
}
