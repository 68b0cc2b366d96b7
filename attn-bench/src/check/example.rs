//! The example input of `attn-bench check --make-example`: seeded q, k, v and dO of a small GQA
//! call with tails, in any storage dtype and layout.

use super::*;

/// Shape of the example input: `B = 2`, `Hq = 4` over `Hk = 2` (GQA), `Nq = 100`, `Nk = 128`
/// (unequal, and neither a multiple of 64, so masks and tile tails are exercised), `D = 64`.
pub const EXAMPLE_SHAPE: ExampleShape = ExampleShape {
    batch: 2,
    heads_q: 4,
    heads_kv: 2,
    seq_q: 100,
    seq_k: 128,
    head_dim: 64,
};

/// The dimensions of [`make_example`]'s tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExampleShape {
    pub batch: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub seq_q: usize,
    pub seq_k: usize,
    pub head_dim: usize,
}

/// Write an input file for `check`: `q`, `k`, `v` and `do` of [`EXAMPLE_SHAPE`] in `dtype` and
/// `layout`, uniform in (−1, 1) from a fixed seed (for an Einstein-midpoint family the values are
/// scaled into the Klein ball, as [`random_case`] draws them). Returns the tensors written.
///
/// ```
/// use attn_bench::check::make_example;
/// use attn_core::{DType, Family, Layout};
/// let path = std::env::temp_dir().join(format!("attn-bench-doc-{}.safetensors", std::process::id()));
/// let tensors = make_example(&path, Family::softmax(), DType::BF16, Layout::Bnhd)?;
/// assert_eq!(tensors[0], "q BF16 [2, 100, 4, 64]");
/// # std::fs::remove_file(&path).ok();
/// # Ok::<(), attn_bench::BenchError>(())
/// ```
pub fn make_example(
    path: &Path,
    family: Family,
    dtype: DType,
    layout: Layout,
) -> Result<Vec<String>, BenchError> {
    let s = EXAMPLE_SHAPE;
    let spec = AttnProblem::new(
        family, dtype, s.batch, s.heads_q, s.heads_kv, s.seq_q, s.seq_k, s.head_dim,
    )
    .with_layout(layout)
    .validate()?;
    let case = random_case(&spec, 0);
    fn tensors<E: Stored>(spec: &AttnSpec, case: &Case) -> Vec<Out> {
        let narrow = |x: &[f64]| E::encode(&x.iter().map(|&v| E::from_f64(v)).collect::<Vec<E>>());
        vec![
            Out {
                name: "q",
                dtype: E::ST_DTYPE,
                shape: spec.q_shape(),
                data: narrow(&case.q),
            },
            Out {
                name: "k",
                dtype: E::ST_DTYPE,
                shape: spec.k_shape(),
                data: narrow(&case.k),
            },
            Out {
                name: "v",
                dtype: E::ST_DTYPE,
                shape: spec.v_shape(),
                data: narrow(&case.v),
            },
            Out {
                name: "do",
                dtype: E::ST_DTYPE,
                shape: spec.o_shape(),
                data: narrow(&case.d_o),
            },
        ]
    }
    let outs = match dtype {
        DType::F32 => tensors::<f32>(&spec, &case),
        DType::F16 => tensors::<f16>(&spec, &case),
        DType::BF16 => tensors::<bf16>(&spec, &case),
    };
    let metadata = HashMap::from([(
        "made_by".to_string(),
        "attn-bench check --make-example (seed 0)".to_string(),
    )]);
    write_file(path, &outs, metadata)?;
    Ok(tensor_lines(&outs))
}
