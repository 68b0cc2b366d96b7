//! Generation on the GPU: `flash_attn_with_kvcache` (contiguous and paged, f32/f16/bf16) against
//! the same step on CPU tensors (attn-cpu-ref), caches included; `TaylorCache` on CUDA (attn-cuda's
//! decode state) against the CPU state; the generation model through the paged cache against plain
//! candle attention (first 64 tokens equal).

use crate::harness::gpu;
use attn_candle::llama::{generate_paged, generate_plain, Llama, LlamaConfig};
use attn_candle::{flash_attn_with_kvcache, seeded_var_builder, AttnCache, Family, TaylorCache};
use candle_core::{DType, Device, Result, Tensor};
use candle_nn::VarMap;

fn max_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    let a = a.to_device(&Device::Cpu)?.to_dtype(DType::F32)?;
    let b = b.to_device(&Device::Cpu)?.to_dtype(DType::F32)?;
    (a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()
}

/// Rounding error allowed between the GPU step and the CPU reference in `dtype`.
fn tol(dtype: DType) -> f32 {
    match dtype {
        DType::F32 => 2e-5,
        DType::F16 => 4e-3,
        _ => 3e-2,
    }
}

#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn kv_cache_step_matches_the_cpu_reference_on_gpu() -> Result<()> {
    let (gpu, cpu) = (gpu(), Device::Cpu);
    let (b, hq, hkv, d) = (3, 8, 2, 128);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (nq, paged, page) in [
            (1, false, 0),
            (4, false, 0),
            (1, true, 16),
            (3, true, 64),
            (1, true, 256),
        ] {
            let case = format!("{dtype:?}, Nq {nq}, paged {paged}, page {page}");
            let q = Tensor::randn(0f32, 1.0, (b, nq, hq, d), &cpu)?.to_dtype(dtype)?;
            let kn = Tensor::randn(0f32, 1.0, (b, nq, hkv, d), &cpu)?.to_dtype(dtype)?;
            let vn = Tensor::randn(0f32, 1.0, (b, nq, hkv, d), &cpu)?.to_dtype(dtype)?;
            // Lengths 0, not a multiple of the page, and the fullest the step allows.
            let (shape, table, cap) = if paged {
                let pages_per_seq = 3;
                let num_pages = b * pages_per_seq + 1;
                // A shuffled assignment: sequence s gets pages s, s + b, s + 2b (+1 spare page).
                let t: Vec<i32> = (0..b)
                    .flat_map(|s| (0..pages_per_seq).map(move |j| (s + j * b) as i32))
                    .collect();
                (
                    (num_pages, page, hkv, d),
                    Some(Tensor::from_vec(t, (b, pages_per_seq), &cpu)?),
                    pages_per_seq * page,
                )
            } else {
                ((b, 300, hkv, d), None, 300)
            };
            let lens = Tensor::new(&[0i32, 37, (cap - nq) as i32], &cpu)?;
            let kc = Tensor::randn(0f32, 1.0, shape, &cpu)?.to_dtype(dtype)?;
            let vc = Tensor::randn(0f32, 1.0, shape, &cpu)?.to_dtype(dtype)?;
            let (kc_gpu, vc_gpu) = (kc.to_device(&gpu)?, vc.to_device(&gpu)?);
            let run = |dev: &Device, kc: &Tensor, vc: &Tensor| {
                flash_attn_with_kvcache(
                    &q.to_device(dev)?,
                    kc,
                    vc,
                    Some(&kn.to_device(dev)?),
                    Some(&vn.to_device(dev)?),
                    &lens.to_device(dev)?,
                    table.as_ref().map(|t| t.to_device(dev)).transpose()?.as_ref(),
                    0.088,
                    true,
                    None,
                    None,
                    None,
                    true,
                )
            };
            let (o_cpu, lse_cpu) = run(&cpu, &kc, &vc)?;
            let (o_gpu, lse_gpu) =
                run(&gpu, &kc_gpu, &vc_gpu).map_err(|e| candle_core::Error::msg(format!("{case}: {e}")))?;
            let err = max_diff(&o_gpu, &o_cpu)?;
            assert!(err <= tol(dtype), "o: {case}: {err}");
            let (lse_cpu, lse_gpu) = (
                lse_cpu.expect("lse").to_vec3::<f32>()?,
                lse_gpu.expect("lse").to_device(&cpu)?.to_vec3::<f32>()?,
            );
            for (x, y) in lse_cpu
                .iter()
                .flatten()
                .flatten()
                .zip(lse_gpu.iter().flatten().flatten())
            {
                assert!(x == y || (x - y).abs() <= 1e-3, "lse: {case}: {x} vs {y}");
            }
            assert_eq!(
                max_diff(&kc_gpu, &kc)?,
                0.0,
                "k cache written as on the CPU: {case}"
            );
            assert_eq!(
                max_diff(&vc_gpu, &vc)?,
                0.0,
                "v cache written as on the CPU: {case}"
            );
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn taylor_cache_on_gpu_matches_the_cpu_state() -> Result<()> {
    let (gpu, cpu) = (gpu(), Device::Cpu);
    let (b, n, hq, hkv, d) = (2, 19, 4, 2, 64);
    let q = Tensor::randn(0f32, 0.3, (b, n, hq, d), &cpu)?;
    let k = Tensor::randn(0f32, 0.3, (b, n, hkv, d), &cpu)?;
    let v = Tensor::randn(0f32, 1.0, (b, n, hkv, d), &cpu)?;
    for family in [Family::taylor(1), Family::taylor(2)] {
        let mut on_cpu = TaylorCache::new(family, b)?;
        let mut on_gpu = TaylorCache::new(family, b)?;
        for (t, len) in [(0, 7), (7, 1), (8, 1), (9, 10)] {
            let part = |x: &Tensor| x.narrow(1, t, len);
            let want = on_cpu.append_and_attend(&part(&q)?, &part(&k)?, &part(&v)?)?;
            let got = on_gpu.append_and_attend(
                &part(&q)?.to_device(&gpu)?,
                &part(&k)?.to_device(&gpu)?,
                &part(&v)?.to_device(&gpu)?,
            )?;
            let err = max_diff(&got, &want)?;
            assert!(err <= 1e-4, "{family:?}, tokens {t}..{}: {err}", t + len);
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn generation_through_the_paged_cache_equals_plain_candle_on_gpu() -> Result<()> {
    let gpu = gpu();
    let cfg = LlamaConfig {
        max_positions: 128,
        ..LlamaConfig::small()
    };
    let vm = VarMap::new();
    let model = Llama::new(cfg, seeded_var_builder(&vm, 7, DType::F32, &gpu))?;
    let prompt: Vec<u32> = (0..20u32).map(|i| (i * 37 + 11) % cfg.vocab as u32).collect();
    let attn = generate_paged(&model, &prompt, 64, 16)?;
    let plain = generate_plain(&model, &prompt, 64)?;
    assert_eq!(attn.tokens, plain.tokens);
    Ok(())
}
