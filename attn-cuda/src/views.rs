//! The crate's buffer types: the storage elements the kernels take and the view entry points'
//! buffers.

use attn_core::Element;
use cudarc::driver::{CudaView, CudaViewMut, DeviceRepr, ValidAsZeroBits};

/// A storage element the kernels read and write: f32, f16 or bf16.
pub trait DeviceElem: Element + DeviceRepr + ValidAsZeroBits + Unpin {}
impl DeviceElem for f32 {}
impl DeviceElem for half::f16 {}
impl DeviceElem for half::bf16 {}

/// Forward buffers as views (a view may start at an element offset: `slice.slice(start..)`).
pub struct ForwardViews<'a, T> {
    pub q: CudaView<'a, T>,
    pub k: CudaView<'a, T>,
    pub v: CudaView<'a, T>,
    pub bias: Option<CudaView<'a, T>>,
    pub o: CudaViewMut<'a, T>,
    pub lse: CudaViewMut<'a, f32>,
}

/// Backward buffers as views.
pub struct BackwardViews<'a, T> {
    pub q: CudaView<'a, T>,
    pub k: CudaView<'a, T>,
    pub v: CudaView<'a, T>,
    pub bias: Option<CudaView<'a, T>>,
    pub o: CudaView<'a, T>,
    pub d_o: CudaView<'a, T>,
    pub lse: CudaView<'a, f32>,
    pub dq: CudaViewMut<'a, T>,
    pub dk: CudaViewMut<'a, T>,
    pub dv: CudaViewMut<'a, T>,
    pub dbias: Option<CudaViewMut<'a, T>>,
}
