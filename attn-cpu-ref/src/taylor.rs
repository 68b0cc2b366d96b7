//! Taylor linear attention (REFERENCE.md §3).
use crate::{Gradients, Inputs};
use attn_core::AttnSpec;

pub(crate) fn forward(_spec: &AttnSpec, _x: &Inputs<'_, f64>, _o: &mut [f64], _stats: &mut [f64]) {
    todo!("taylor forward")
}

pub(crate) fn backward(
    _spec: &AttnSpec,
    _x: &Inputs<'_, f64>,
    _o: &[f64],
    _d_o: &[f64],
    _stats: &[f64],
    _g: &mut Gradients<f64>,
) {
    todo!("taylor backward")
}
