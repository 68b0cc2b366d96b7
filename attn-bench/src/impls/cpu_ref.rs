//! `attn-cpu-ref` as a benchmarked implementation: the public storage-dtype API, exactly as a user
//! calls it (inputs widened to f64 inside, outputs rounded back, statistics in f32). The runner
//! also serves the fast path (`cpu_fast`), which has the same signatures.

use super::Runner;
use crate::error::BenchError;
use crate::grid::PassKind;
use attn_core::{bf16, f16, AttnSpec, DType, Element};
use attn_cpu_ref::{backward, forward, testing::random_case, Forward, Gradients, Inputs};
use std::hint::black_box;

/// A CPU forward on storage-dtype buffers (`attn_cpu_ref::forward` or `attn_cpu_ref::fast::forward`).
pub(super) type ForwardFn<E> = fn(&AttnSpec, Inputs<'_, E>) -> attn_core::Result<Forward<E, f32>>;
/// The matching backward from o, dO and the statistics.
pub(super) type BackwardFn<E> =
    fn(&AttnSpec, Inputs<'_, E>, &[E], &[E], &[f32]) -> attn_core::Result<Gradients<E>>;

/// A storage type with the two entry points of one CPU implementation.
pub(super) struct CpuFns<E: Element> {
    pub forward: ForwardFn<E>,
    pub backward: BackwardFn<E>,
}

struct CpuRefRunner<E: Element> {
    fns: CpuFns<E>,
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

impl<E: Element> CpuRefRunner<E> {
    fn new(fns: CpuFns<E>, spec: &AttnSpec, pass: PassKind, seed: u64) -> Result<Self, BenchError> {
        let case = random_case(spec, seed);
        let mut r = CpuRefRunner {
            fns,
            spec: spec.clone(),
            pass,
            q: narrow(&case.q),
            k: narrow(&case.k),
            v: narrow(&case.v),
            d_o: narrow(&case.d_o),
            saved: None,
        };
        if pass == PassKind::Bwd {
            r.saved = Some((r.fns.forward)(spec, r.inputs())?);
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

impl<E: Element> Runner for CpuRefRunner<E> {
    fn call(&mut self) -> Result<(), BenchError> {
        let saved;
        let f = match (self.pass, &self.saved) {
            (PassKind::Bwd, Some(f)) => f,
            _ => {
                saved = (self.fns.forward)(&self.spec, self.inputs())?;
                &saved
            }
        };
        if self.pass.needs_backward() {
            let g = (self.fns.backward)(&self.spec, self.inputs(), &f.o, &self.d_o, &f.stats)?;
            black_box(g);
        }
        black_box(f);
        Ok(())
    }
}

/// The entry points of one CPU implementation for every storage dtype.
pub(super) trait CpuImpl {
    fn fns<E: Element>() -> CpuFns<E>;
}

/// The reference's public storage-dtype API.
struct Reference;

impl CpuImpl for Reference {
    fn fns<E: Element>() -> CpuFns<E> {
        CpuFns {
            forward: forward::<E>,
            backward: backward::<E>,
        }
    }
}

/// Set up `I` on `spec` (seeded inputs; a backward-only pass runs its forward here).
pub(super) fn prepare_with<I: CpuImpl>(
    spec: &AttnSpec,
    pass: PassKind,
    seed: u64,
) -> Result<Box<dyn Runner>, BenchError> {
    Ok(match spec.dtype() {
        DType::F32 => Box::new(CpuRefRunner::<f32>::new(I::fns(), spec, pass, seed)?),
        DType::F16 => Box::new(CpuRefRunner::<f16>::new(I::fns(), spec, pass, seed)?),
        DType::BF16 => Box::new(CpuRefRunner::<bf16>::new(I::fns(), spec, pass, seed)?),
    })
}

pub(super) fn prepare(spec: &AttnSpec, pass: PassKind, seed: u64) -> Result<Box<dyn Runner>, BenchError> {
    prepare_with::<Reference>(spec, pass, seed)
}
