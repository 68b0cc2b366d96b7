//! Generation through a KV cache on the CPU: `flash_attn_with_kvcache` runs attn-cpu-ref's
//! `fast::forward_kv_cache` on the tensors' own data and writes the caches in place; the cache types
//! (contiguous, paged, Taylor) give the causal forward of the whole sequence when fed a prompt and
//! then one token at a time, while growing; the decoder layer through a cache equals the same layer
//! run over the whole sequence; bad arguments are typed errors naming them.

use attn_candle::{
    attention, flash_attn, flash_attn_with_kvcache, AttnCache, AttnOptions, Causal, DecoderAttention,
    DecoderAttentionConfig, Family, KvAttnOptions, KvCache, PagedKvCache, Rotary, TaylorCache,
};
use attn_core::{DType as ADType, KvCacheProblem, KvLayout, SoftmaxParams};
use attn_cpu_ref::fast::forward_kv_cache;
use attn_cpu_ref::kv_cache::KvCacheIo;
use candle_core::{DType, Device, Result, Tensor};
use candle_nn::{VarBuilder, VarMap};

fn flat(t: &Tensor) -> Result<Vec<f32>> {
    t.flatten_all()?.to_vec1::<f32>()
}

fn max_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    (a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()
}

#[test]
fn flash_attn_with_kvcache_is_the_reference_step_and_writes_in_place() -> Result<()> {
    let dev = Device::Cpu;
    let (b, nq, hq, hkv, d, page) = (2, 3, 4, 2, 16, 16);
    for paged in [false, true] {
        let q = Tensor::randn(0f32, 1.0, (b, nq, hq, d), &dev)?;
        let k_new = Tensor::randn(0f32, 1.0, (b, nq, hkv, d), &dev)?;
        let v_new = Tensor::randn(0f32, 1.0, (b, nq, hkv, d), &dev)?;
        let lens = [7i32, 30];
        let (cache_shape, layout, table) = if paged {
            let table = vec![5i32, 1, 3, 0, 2, 4];
            (
                (6, page, hkv, d),
                KvLayout::Paged {
                    num_pages: 6,
                    page_size: page,
                    pages_per_seq: 3,
                },
                Some(table),
            )
        } else {
            ((b, 40, hkv, d), KvLayout::Contiguous { capacity: 40 }, None)
        };
        let k_cache = Tensor::randn(0f32, 1.0, cache_shape, &dev)?;
        let v_cache = Tensor::randn(0f32, 1.0, cache_shape, &dev)?;
        // The reference on copies of the same values.
        let spec = KvCacheProblem::new(
            Family::Softmax(SoftmaxParams {
                scale: Some(0.3),
                softcap: Some(5.0),
            }),
            ADType::F32,
            b,
            hq,
            hkv,
            nq,
            d,
            layout,
        )
        .with_window(Some(9), Some(0))
        .validate()
        .map_err(candle_core::Error::wrap)?;
        let (mut kc, mut vc) = (flat(&k_cache)?, flat(&v_cache)?);
        let want = forward_kv_cache(
            &spec,
            KvCacheIo {
                q: &flat(&q)?,
                k_cache: &mut kc,
                v_cache: &mut vc,
                k_new: Some(&flat(&k_new)?),
                v_new: Some(&flat(&v_new)?),
                cache_seqlens: &lens,
                block_table: table.as_deref(),
            },
        )
        .map_err(candle_core::Error::wrap)?;
        let alias = k_cache.clone(); // shares k_cache's storage
        let table_t = table
            .as_ref()
            .map(|t| Tensor::from_vec(t.clone(), (b, 3), &dev))
            .transpose()?;
        let (o, lse) = flash_attn_with_kvcache(
            &q,
            &k_cache,
            &v_cache,
            Some(&k_new),
            Some(&v_new),
            &Tensor::new(&[7u32, 30], &dev)?,
            table_t.as_ref(),
            0.3,
            true,
            Some(9),
            Some(0),
            Some(5.0),
            true,
        )?;
        assert_eq!(flat(&o)?, want.o, "o (paged {paged})");
        assert_eq!(flat(&lse.expect("requested"))?, want.stats, "lse (paged {paged})");
        assert_eq!(flat(&k_cache)?, kc, "k_cache written in place (paged {paged})");
        assert_eq!(flat(&v_cache)?, vc, "v_cache written in place (paged {paged})");
        assert_eq!(flat(&alias)?, kc, "a clone sees the new rows (paged {paged})");
    }
    Ok(())
}

fn err_of(r: Result<(Tensor, Option<Tensor>)>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_arguments_name_what_the_caller_passed() -> Result<()> {
    let dev = Device::Cpu;
    let q = Tensor::zeros((2, 1, 4, 16), DType::F32, &dev)?;
    let kc = Tensor::zeros((2, 32, 2, 16), DType::F32, &dev)?;
    let vc = Tensor::zeros((2, 32, 2, 16), DType::F32, &dev)?;
    let kn = Tensor::zeros((2, 1, 2, 16), DType::F32, &dev)?;
    let lens = Tensor::new(&[0i32, 0], &dev)?;
    let call = |q: &Tensor,
                kc: &Tensor,
                vc: &Tensor,
                kn: Option<&Tensor>,
                vn: Option<&Tensor>,
                lens: &Tensor,
                table: Option<&Tensor>| {
        err_of(flash_attn_with_kvcache(
            q, kc, vc, kn, vn, lens, table, 0.25, true, None, None, None, false,
        ))
    };
    let e = call(&q, &kc.narrow(3, 0, 8)?, &vc, Some(&kn), Some(&kn), &lens, None);
    assert!(e.contains("`k_cache`"), "{e}");
    let e = call(&q, &kc, &vc, Some(&kn), None, &lens, None);
    assert!(e.contains("`v_new`"), "{e}");
    let e = call(
        &q,
        &kc,
        &vc.to_dtype(DType::F16)?,
        Some(&kn),
        Some(&kn),
        &lens,
        None,
    );
    assert!(e.contains("`v_cache`") && e.contains("dtype"), "{e}");
    let e = call(
        &q,
        &kc,
        &vc,
        Some(&kn),
        Some(&kn),
        &Tensor::new(&[32i32, 0], &dev)?,
        None,
    );
    assert!(
        e.contains("`cache_seqlens`") && e.contains("cache_seqlens[0] = 32"),
        "{e}"
    );
    let e = call(
        &q,
        &kc,
        &vc,
        Some(&kn),
        Some(&kn),
        &Tensor::new(&[0i32], &dev)?,
        None,
    );
    assert!(e.contains("`cache_seqlens`"), "{e}");
    let e = call(&q, &kc, &kc, Some(&kn), Some(&kn), &lens, None);
    assert!(e.contains("shares its storage"), "{e}");
    let strided = Tensor::zeros((2, 2, 32, 16), DType::F32, &dev)?.transpose(1, 2)?;
    let e = call(&q, &strided, &vc, Some(&kn), Some(&kn), &lens, None);
    assert!(e.contains("not contiguous"), "{e}");
    // Paged: a page size that is not a power of two, a table entry outside the pool.
    let pages = Tensor::zeros((4, 24, 2, 16), DType::F32, &dev)?;
    let table = Tensor::new(&[[0i32], [1]], &dev)?;
    let e = call(
        &q,
        &pages,
        &pages.zeros_like()?,
        Some(&kn),
        Some(&kn),
        &lens,
        Some(&table),
    );
    assert!(
        e.contains("`k_cache`") && e.contains("page_size") || e.contains("power of two"),
        "{e}"
    );
    let pages = Tensor::zeros((4, 16, 2, 16), DType::F32, &dev)?;
    let bad = Tensor::new(&[[0i32], [4]], &dev)?;
    let e = call(
        &q,
        &pages,
        &pages.zeros_like()?,
        Some(&kn),
        Some(&kn),
        &lens,
        Some(&bad),
    );
    assert!(
        e.contains("`block_table`") && e.contains("block_table[1][0] = 4"),
        "{e}"
    );
    let e = call(
        &q,
        &pages,
        &pages.zeros_like()?,
        Some(&kn),
        Some(&kn),
        &lens,
        Some(&Tensor::new(&[[0f32], [1.0]], &dev)?),
    );
    assert!(e.contains("`block_table`"), "{e}");
    // Nothing was written by a failed call.
    assert_eq!(kc.abs()?.sum_all()?.to_scalar::<f32>()?, 0.0);
    Ok(())
}

/// Feed `n` tokens to `cache`: a prompt of `prefill` tokens, then one at a time; returns o for the
/// whole sequence `[B, n, Hq, D]`.
fn feed(cache: &mut dyn AttnCache, q: &Tensor, k: &Tensor, v: &Tensor, prefill: usize) -> Result<Tensor> {
    let n = q.dim(1)?;
    let mut outs = vec![cache.append_and_attend(
        &q.narrow(1, 0, prefill)?,
        &k.narrow(1, 0, prefill)?,
        &v.narrow(1, 0, prefill)?,
    )?];
    for t in prefill..n {
        outs.push(cache.append_and_attend(&q.narrow(1, t, 1)?, &k.narrow(1, t, 1)?, &v.narrow(1, t, 1)?)?);
    }
    Tensor::cat(&outs, 1)
}

#[test]
fn caches_grow_and_decode_equals_the_causal_forward() -> Result<()> {
    let dev = Device::Cpu;
    let (b, n, hq, hkv, d) = (2, 45, 8, 2, 16);
    let q = Tensor::randn(0f32, 1.0, (b, n, hq, d), &dev)?;
    let k = Tensor::randn(0f32, 1.0, (b, n, hkv, d), &dev)?;
    let v = Tensor::randn(0f32, 1.0, (b, n, hkv, d), &dev)?;
    let want = flash_attn(&q, &k, &v, 0.25, true)?;
    let opts = KvAttnOptions::softmax(Some(0.25));
    // A contiguous cache of 4 slots grows to hold 45 tokens.
    let mut contiguous = KvCache::new(b, 4, hkv, d, DType::F32, &dev, opts)?;
    let got = feed(&mut contiguous, &q, &k, &v, 7)?;
    assert!(
        max_diff(&got, &want)? < 1e-5,
        "contiguous: {}",
        max_diff(&got, &want)?
    );
    assert_eq!(contiguous.lens(), &[45, 45]);
    assert!(contiguous.capacity() >= 45);
    assert_eq!(contiguous.cache_seqlens().to_vec1::<i32>()?, vec![45, 45]);
    // A paged cache with a pool of one page grows its pool and its block table.
    for page in [16, 32] {
        let mut paged = PagedKvCache::new(b, page, 1, hkv, d, DType::F32, &dev, opts)?;
        let got = feed(&mut paged, &q, &k, &v, 7)?;
        assert!(
            max_diff(&got, &want)? < 1e-5,
            "paged {page}: {}",
            max_diff(&got, &want)?
        );
        assert_eq!(paged.cache_seqlens().to_vec1::<i32>()?, vec![45, 45]);
        let used = n.div_ceil(page);
        assert_eq!(paged.pages_of(0).len(), used);
        // Freeing a sequence returns its pages; new tokens reuse them without growing the pool.
        let pool = paged.num_pages();
        paged.free_sequence(1)?;
        assert_eq!(paged.lens(), &[45, 0]);
        paged.free_sequence(0)?;
        let mut again = feed(
            &mut paged,
            &q.narrow(1, 0, 3)?,
            &k.narrow(1, 0, 3)?,
            &v.narrow(1, 0, 3)?,
            3,
        )?;
        again = again.contiguous()?;
        assert!(max_diff(&again, &want.narrow(1, 0, 3)?)? < 1e-5);
        assert_eq!(paged.num_pages(), pool, "freed pages are reused (page {page})");
        assert_eq!((paged.pages_of(0).len(), paged.pages_of(1).len()), (1, 1));
    }
    Ok(())
}

#[test]
fn taylor_cache_decode_equals_the_causal_forward() -> Result<()> {
    let dev = Device::Cpu;
    let (b, n, hq, hkv, d) = (2, 20, 4, 2, 8);
    let q = Tensor::randn(0f32, 1.0, (b, n, hq, d), &dev)?;
    let k = Tensor::randn(0f32, 1.0, (b, n, hkv, d), &dev)?;
    let v = Tensor::randn(0f32, 1.0, (b, n, hkv, d), &dev)?;
    let family = Family::taylor(2);
    let want = attention(
        &q,
        &k,
        &v,
        &AttnOptions::new(family).with_causal(Causal::BottomRight),
    )?;
    let mut cache = TaylorCache::new(family, b)?;
    let got = feed(&mut cache, &q, &k, &v, 6)?;
    assert!(max_diff(&got, &want)? < 1e-5, "{}", max_diff(&got, &want)?);
    assert_eq!(cache.lens(), &[20, 20]);
    assert!(TaylorCache::new(Family::softmax(), 1).is_err());
    Ok(())
}

#[test]
fn decoder_layer_through_a_cache_equals_the_whole_sequence() -> Result<()> {
    let dev = Device::Cpu;
    let cfg = DecoderAttentionConfig {
        hidden: 64,
        heads_q: 8,
        heads_kv: 2,
        head_dim: 16,
    };
    let vm = VarMap::new();
    let rotary = Rotary::new(16, 128, 10_000.0, DType::F32, &dev)?;
    let layer = DecoderAttention::new(
        cfg,
        rotary.clone(),
        VarBuilder::from_varmap(&vm, DType::F32, &dev),
    )?;
    let (b, n) = (2, 21);
    let x = Tensor::randn(0f32, 1.0, (b, n, 64), &dev)?;
    // Whole sequence: q, k, v at positions 0..n, causal attention, output projection.
    let (q, k, v) = layer.qkv(&x, &rotary.positions(&[0, 0], n, &dev)?)?;
    let want = layer.project_out(&flash_attn(&q, &k, &v, 0.25, true)?)?;
    let mut cache = PagedKvCache::new(b, 16, 2, 2, 16, DType::F32, &dev, KvAttnOptions::softmax(None))?;
    let mut outs = vec![layer.forward(
        &x.narrow(1, 0, 9)?,
        &mut cache,
        &rotary.positions(&[0, 0], 9, &dev)?,
    )?];
    for t in 9..n {
        let pos = rotary.positions(cache.lens(), 1, &dev)?;
        outs.push(layer.forward(&x.narrow(1, t, 1)?, &mut cache, &pos)?);
    }
    let got = Tensor::cat(&outs, 1)?;
    assert!(max_diff(&got, &want)? < 1e-5, "{}", max_diff(&got, &want)?);
    // Rotary embeddings do change q: position 0 leaves it, position 5 does not.
    let x1 = x.narrow(1, 0, 1)?;
    let (q0, _, _) = layer.qkv(&x1, &rotary.positions(&[0, 0], 1, &dev)?)?;
    let (q5, _, _) = layer.qkv(&x1, &rotary.positions(&[5, 5], 1, &dev)?)?;
    assert!(max_diff(&q0, &q5)? > 1e-3);
    let raw = x1.apply(&candle_nn::linear_no_bias(
        64,
        128,
        VarBuilder::from_varmap(&vm, DType::F32, &dev).pp("q_proj"),
    )?)?;
    assert!(max_diff(&q0.flatten_from(2)?, &raw)? < 1e-6);
    assert!(rotary.positions(&[127], 2, &dev).is_err());
    Ok(())
}
