//! Prepared rows: q, k and v of each (batch, head) slice gathered once, through the spec's offsets,
//! into contiguous row-major buffers with per-row scalars `A` (see [`super::score`]), so the inner
//! loops run on contiguous slices whatever the layout, strides or packing of the inputs.

use attn_core::AttnSpec;
use rayon::prelude::*;

/// `n` rows of `dim` values, contiguous, and the scalars `A` of each row.
pub(super) struct Rows<A> {
    dim: usize,
    data: Vec<f64>,
    aux: Vec<A>,
}

impl<A: Copy> Rows<A> {
    /// Gather `n` rows of `dim` values from `x`, row `r` starting at `offset(r)`, and embed each one
    /// with `embed(raw, out) -> scalar`.
    fn gather(
        x: &[f64],
        n: usize,
        dim: usize,
        offset: impl Fn(usize) -> usize,
        embed: impl Fn(&[f64], &mut [f64]) -> A,
    ) -> Rows<A> {
        let mut data = vec![0.0; n * dim];
        let aux = data
            .chunks_exact_mut(dim)
            .enumerate()
            .map(|(r, out)| {
                let start = offset(r);
                embed(&x[start..start + dim], out)
            })
            .collect();
        Rows { dim, data, aux }
    }

    #[inline]
    pub(super) fn row(&self, r: usize) -> &[f64] {
        &self.data[r * self.dim..(r + 1) * self.dim]
    }

    #[inline]
    pub(super) fn aux(&self, r: usize) -> &A {
        &self.aux[r]
    }
}

/// The [`Rows`] of every (batch entry, head) slice of one tensor.
pub(super) struct Slices<A> {
    heads: usize,
    slices: Vec<Rows<A>>,
}

/// Which tensor to gather.
#[derive(Clone, Copy)]
pub(super) enum Tensor {
    Q,
    K,
    V,
}

impl<A: Copy + Send + Sync> Slices<A> {
    /// Gather tensor `t` from `x`: every query row of q (`Hq` heads, `D` wide), or every valid key row
    /// of k (`Hkv`, `D`) or v (`Hkv`, `Dv`), embedding each row with `embed`.
    pub(super) fn gather(
        spec: &AttnSpec,
        t: Tensor,
        x: &[f64],
        embed: impl Fn(&[f64], &mut [f64]) -> A + Sync,
    ) -> Slices<A> {
        let heads = match t {
            Tensor::Q => spec.heads_q(),
            Tensor::K | Tensor::V => spec.heads_kv(),
        };
        let slices = (0..spec.batch() * heads)
            .into_par_iter()
            .map(|bh| {
                let (b, h) = (bh / heads, bh % heads);
                let lens = spec.seq_lens(b);
                match t {
                    Tensor::Q => Rows::gather(x, lens.q, spec.head_dim(), |i| spec.q_offset(b, i, h), &embed),
                    Tensor::K => Rows::gather(x, lens.k, spec.head_dim(), |j| spec.k_offset(b, j, h), &embed),
                    Tensor::V => {
                        Rows::gather(x, lens.k, spec.head_dim_v(), |j| spec.v_offset(b, j, h), &embed)
                    }
                }
            })
            .collect();
        Slices { heads, slices }
    }

    #[inline]
    pub(super) fn get(&self, b: usize, h: usize) -> &Rows<A> {
        &self.slices[b * self.heads + h]
    }
}
