//! `attn-cpu-fast`: attn-cpu-ref's f32-accumulating fast path ([`attn_cpu_ref::fast`]), the one
//! attn-candle runs on CPU tensors, on storage-dtype buffers. Softmax-like families only; a Taylor
//! point is skipped with the path's `Unsupported` text.

use super::Runner;
use crate::error::BenchError;
use crate::grid::PassKind;
use attn_core::{bf16, f16, AttnSpec, DType, Element};
use attn_cpu_ref::fast::{backward, forward};
use attn_cpu_ref::{testing::random_case, Forward, Inputs};
use std::hint::black_box;

struct CpuFastRunner<E: Element> {
    spec: AttnSpec,
    pass: PassKind,
    q: Vec<E>,
    k: Vec<E>,
    v: Vec<E>,
    d_o: Vec<E>,
    /// The forward a backward-only pass starts from.
    saved: Option<Forward<E, f32>>,
}

fn narrow<E: Element>(x: &[f64]) -> Vec<E> {
    x.iter().map(|&e| E::from_f64(e)).collect()
}

impl<E: Element> CpuFastRunner<E> {
    fn new(spec: &AttnSpec, pass: PassKind, seed: u64) -> Result<Self, BenchError> {
        let case = random_case(spec, seed);
        let mut r = CpuFastRunner {
            spec: spec.clone(),
            pass,
            q: narrow(&case.q),
            k: narrow(&case.k),
            v: narrow(&case.v),
            d_o: narrow(&case.d_o),
            saved: None,
        };
        if pass == PassKind::Bwd {
            r.saved = Some(forward(spec, r.inputs())?);
        }
        Ok(r)
    }

    fn inputs(&self) -> Inputs<'_, E> {
        Inputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            bias: None,
        }
    }
}

impl<E: Element> Runner for CpuFastRunner<E> {
    fn call(&mut self) -> Result<(), BenchError> {
        let saved;
        let f = match (self.pass, &self.saved) {
            (PassKind::Bwd, Some(f)) => f,
            _ => {
                saved = forward(&self.spec, self.inputs())?;
                &saved
            }
        };
        if self.pass.needs_backward() {
            let g = backward(&self.spec, self.inputs(), &f.o, &self.d_o, &f.stats)?;
            black_box(g);
        }
        black_box(f);
        Ok(())
    }
}

/// Set up the fast path on `spec` (seeded inputs; a backward-only pass runs its forward here).
pub fn prepare(spec: &AttnSpec, pass: PassKind, seed: u64) -> Result<Box<dyn Runner>, BenchError> {
    Ok(match spec.dtype() {
        DType::F32 => Box::new(CpuFastRunner::<f32>::new(spec, pass, seed)?),
        DType::F16 => Box::new(CpuFastRunner::<f16>::new(spec, pass, seed)?),
        DType::BF16 => Box::new(CpuFastRunner::<bf16>::new(spec, pass, seed)?),
    })
}
