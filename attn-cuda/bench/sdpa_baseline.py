"""PyTorch baselines for attn-cuda's kernel timings, on the same grid and in the same run.

Usage: python3 sdpa_baseline.py [ours.csv]
Times torch SDPA with the flash backend (FlashAttention-2) and the cuDNN backend, and cosine-sim
"as users run it today" (l2-normalise q, k, then SDPA with scale 10), with
triton.testing.do_bench (median). With ours.csv (gpu_bench --out), prints the ratio table
(ours / baseline, > 1 means we are faster) last.
"""
import csv
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench


def run(backend, q, k, v, causal, scale, cosine, backward):
    def f():
        qq, kk = (F.normalize(q, dim=-1), F.normalize(k, dim=-1)) if cosine else (q, k)
        with sdpa_kernel([backend]):
            o = F.scaled_dot_product_attention(qq, kk, v, is_causal=causal, scale=scale)
        if backward:
            o.backward(do)
        return o

    do = torch.randn_like(q)
    for t in (q, k, v):
        t.grad = None
    return do_bench(f, warmup=50, rep=300, return_mode="median")


rows = []
for family in ("softmax", "cosine_sim"):
    for d in (64, 128):
        for n in (4096, 16384):
            for causal in (False, True):
                b, h = 16384 // n, 2048 // d
                mk = lambda: torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                q, k, v = mk(), mk(), mk()
                cosine = family == "cosine_sim"
                scale = 10.0 if cosine else None
                flops = 4 * b * h * n * n * d * (0.5 if causal else 1.0)
                for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                    for pas, bw, fl in (("fwd", False, flops), ("fwd_bwd", True, 3.5 * flops)):
                        try:
                            if bw:
                                ms = run(backend, q, k, v, causal, scale, cosine, True)
                            else:
                                with torch.no_grad():
                                    ms = run(backend, q, k, v, causal, scale, cosine, False)
                            tf = fl / (ms * 1e-3) / 1e12
                        except Exception as e:  # a backend may refuse a shape
                            print(f"{family} {name} d={d} n={n} causal={causal} {pas}: {type(e).__name__}: {e}")
                            ms, tf = float("nan"), float("nan")
                        rows.append((family, d, n, causal, pas, name, ms, tf))
                        print(f"{family:<11} {d:>4} {n:>6} {str(causal):>6} {pas:>8} {name:>6} {ms:9.3f} {tf:8.1f}", flush=True)

if len(sys.argv) > 1:
    ours = {}
    with open(sys.argv[1]) as f:
        for r in csv.DictReader(f):
            ours[(r["family"], int(r["d"]), int(r["n"]), r["causal"] == "true", r["pass"])] = float(r["tflops"])
    print("\nours vs baselines (TFLOP/s; ratio = ours / baseline)")
    print(f"{'family':<11} {'D':>4} {'N':>6} {'causal':>6} {'pass':>8} {'ours':>7} {'flash':>7} {'cudnn':>7} {'/flash':>7} {'/cudnn':>7}")
    base = {}
    for family, d, n, causal, pas, name, ms, tf in rows:
        base[(family, d, n, causal, pas, name)] = tf
    for key, tf in ours.items():
        if len(key) != 5 or key[4] not in ("fwd", "fwd_bwd"):
            continue
        fl = base.get(key + ("flash",), float("nan"))
        cu = base.get(key + ("cudnn",), float("nan"))
        family, d, n, causal, pas = key
        print(f"{family:<11} {d:>4} {n:>6} {str(causal):>6} {pas:>8} {tf:7.1f} {fl:7.1f} {cu:7.1f} {tf / fl:7.2f} {tf / cu:7.2f}")
