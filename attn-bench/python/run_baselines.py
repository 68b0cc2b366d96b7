#!/usr/bin/env python3
"""PyTorch baselines for attn-bench, on the GPU machine, in attn-bench's JSON schema (schema 1).

The points come from `attn-bench plan --out plan.json` (`--points plan.json`: exactly the grid our
binary measures) or, without it, from this script's own copy of the FlashAttention grid
(16k tokens per batch, hidden 2048, N 512..16384, long N for the linear family and softmax). Same
FLOP formulas and row fields as attn-bench. Baselines per family:

- softmax: sdpa_flash, sdpa_cudnn, sdpa_efficient (torch.nn.attention.sdpa_kernel, one backend each);
- cosine_sim: torch_l2norm_sdpa = F.normalize(q), F.normalize(k), then SDPA(scale=10) with the fastest
  of the three backends at that point (the backend is named in `params`);
- taylor1 / taylor2: torch_taylor = the factorised states in torch.einsum (non-causal: global states;
  causal: chunks of 64, dense within a chunk, prefix states across chunks); fla_parallel_based
  (fla-core's quadratic Triton kernel of order-2 Taylor, "Based"; causal only) when `fla` imports
  (`--pythonpath DIR` adds an unpacked wheel after the system's packages);
- hyperbolic_geodesic / hyperbolic_sq_lorentz: torch_hyperbolic = the scores written in eager PyTorch
  on materialised B·H·N² tensors (Lorentz product by a matmul in the storage dtype, score and
  softmax in f32, P·V in the storage dtype), as a user would write it without a fused kernel.

Decode points (`attn-bench plan --preset decode`: fewer queries than keys, q [B, Hq, Nq, D] against
k, v [B, Hkv, T, D], causal bottom-right): the three SDPA backends on the same shapes, with
`enable_gqa=True` where Hq > Hkv, or, where a backend rejects it, the kv heads repeated with
repeat_interleave before the timed calls (the row's `params` says which: `gqa=enable_gqa` or
`gqa=repeat_interleave`). One query sees every key, so Nq = 1 runs without a mask; more queries take
torch's `causal_lower_right` bias (`mask=causal_lower_right`). Each decode row carries
`bytes_moved` (k, v, q and o once, the statistics) and `bandwidth_pct` of the copy bandwidth measured
at the start (a device-to-device copy of 1 GiB, best of ten). Paged points (`page_size`) have no SDPA
counterpart: the contiguous row of the same shape is their baseline, so they get no work here.

With `--check-bin attn-bench`, each baseline first runs once at a small shape on the inputs that
`attn-bench check` (the CPU reference) gets, and the largest output difference is printed and kept
in `baseline_checks`: a ratio is only meaningful between two computations of the same function.

Every (baseline, point) that cannot run is written to `skipped` with the reason (backend not
available, out of memory at that N, too slow for the per-point budget, past the global deadline):
never as a zero. Once a baseline runs out of memory, its larger points of the same kind are skipped
with the N where it ran out. Rows are flushed to the output after every point, so a run cut short
keeps what it measured.

Usage (GPU machine): python3 run_baselines.py --points plan.json --out $OUT/baselines.json
         (CPU dry run):  python3 run_baselines.py --points plan.json --device cpu --out b.json
         (anywhere):     python3 run_baselines.py --dry-run      # print the plan, no torch needed
"""

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time

FAMILIES = ["softmax", "cosine_sim", "taylor1", "taylor2", "hyperbolic_geodesic", "hyperbolic_sq_lorentz"]
LINEAR = {"taylor1": 1, "taylor2": 2}
HYPERBOLIC = {"hyperbolic_geodesic": "geodesic", "hyperbolic_sq_lorentz": "sq_lorentz"}
TAYLOR_A = (1.0, 1.0, 0.5)
COSINE_SCALE = 10.0
COSINE_EPS = 1e-6
TAYLOR_CHUNK = 64
# attn-core's HyperbolicParams defaults and ACOSH_EPS.
HYP_CURVATURE = 1.0
HYP_BETA = 1.0
ACOSH_EPS = 1e-6
# Baselines whose work and memory grow as N² per (batch, head).
QUADRATIC = {"sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "torch_l2norm_sdpa", "fla_parallel_based",
             "torch_hyperbolic"}


# ---------------------------------------------------------------- grid and formulas (as flops.rs)

def batch_heads(args, n, d):
    if n <= 0:
        return None, "sequence length %d" % n
    batch = args.batch if args.batch else max(1, args.tokens // n)
    if args.heads:
        return (batch, args.heads), None
    if d <= 0 or args.hidden % d:
        return None, "hidden %d is not a multiple of head dim %d" % (args.hidden, d)
    return (batch, args.hidden // d), None


def softmax_fwd_flops(b, h, nq, nk, d, dv, causal):
    f = 2.0 * b * h * nq * nk * (d + dv)
    if not causal:
        return f
    if nq < nk:
        # Bottom-right (decode): query i of nq sees nk - nq + 1 + i keys.
        return f * (nq * nk - nq * (nq - 1) / 2) / (nq * nk)
    return f / 2


def taylor_features(order, d):
    return 1 + d if order == 1 else 1 + d + d * (d + 1) // 2


def pass_flops(family, pass_, b, h, n, d, causal, nq=None):
    """FLOPs of a pass at n keys and nq queries (default n), as flops.rs."""
    nq = n if nq is None else nq
    if family in LINEAR:
        fwd = 2.0 * b * h * (nq + n) * taylor_features(LINEAR[family], d) * (d + 1)
        return fwd * {"fwd": 1.0, "bwd": 2.0, "fwd_bwd": 3.0}[pass_]
    fwd = softmax_fwd_flops(b, h, nq, n, d, d, causal)
    return fwd * {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}[pass_]


def bytes_moved(pass_, b, h, n, d, elem, nq=None, hkv=None):
    """Compulsory bytes at n keys, nq queries (default n), h query heads and hkv kv heads (default h)."""
    nq = n if nq is None else nq
    hkv = h if hkv is None else hkv
    q = o = b * nq * h * d * elem
    k = v = b * n * hkv * d * elem
    stats = b * h * nq * 4
    fwd = q + k + v + o + stats
    bwd = q + k + v + 2 * o + stats + q + k + v
    return {"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd + bwd}[pass_]


def is_decode(p):
    return p.get("nq", p["n"]) < p["n"]


def plan(args):
    """Points in priority order: the regular grid first, long N last."""
    points, bad = [], []
    regular, long_ = [], []
    for family in args.families:
        if family not in FAMILIES:
            bad.append("unknown family `%s`" % family)
            continue
        seqs = [(n, False) for n in args.seq_lens]
        if family in args.long_families:
            seqs += [(n, True) for n in args.long_seq_lens if n not in args.seq_lens]
        for dtype in args.dtypes:
            for d in args.head_dims:
                for causal in args.causal:
                    for n, is_long in seqs:
                        bh, why = batch_heads(args, n, d)
                        if bh is None:
                            bad.append("%s %s N=%d D=%d: %s" % (family, dtype, n, d, why))
                            continue
                        if d > 256:
                            bad.append("%s %s N=%d D=%d: head dim beyond 256" % (family, dtype, n, d))
                            continue
                        for pass_ in args.passes:
                            p = dict(family=family, dtype=dtype, pass_=pass_, batch=bh[0], heads=bh[1],
                                     hkv=bh[1], nq=n, n=n, d=d, causal=causal, page_size=None)
                            (long_ if is_long else regular).append(p)
    points = regular + long_
    return points, bad


def load_points(path):
    """Points of `attn-bench plan --out` (its JSON), in its order, and its bad points."""
    with open(path) as f:
        data = json.load(f)
    points = []
    for q in data["points"]:
        # `seq` is the keys per sequence; `seq_q` (decode plans) the queries, else the same.
        nk = q.get("seq_k", q["seq"])
        points.append(dict(family=q["family"], dtype=q["dtype"], pass_=q["pass"], batch=q["batch"],
                           heads=q["heads_q"], hkv=q.get("heads_kv", q["heads_q"]), nq=q.get("seq_q", nk), n=nk,
                           d=q["head_dim"], causal=q["causal"], page_size=q.get("page_size"),
                           section=q.get("section", "")))
        p = points[-1]
        if p["heads"] % p["hkv"]:
            raise ValueError("point with heads_q %d not a multiple of heads_kv %d" % (p["heads"], p["hkv"]))
        if p["nq"] > p["n"] or (p["hkv"] != p["heads"] and not is_decode(p)):
            raise ValueError("point with Nq > Nk, or GQA outside a decode point: the baselines do not run it")
    return points, list(data.get("bad_points", []))


def baselines_for(p, long_softmax_impls):
    fam = p["family"]
    if p.get("page_size"):
        return []  # no paged SDPA: the contiguous row of the shape is the baseline
    if is_decode(p):
        return ["sdpa_cudnn", "sdpa_flash", "sdpa_efficient"] if fam == "softmax" else []
    if fam == "softmax":
        impls = ["sdpa_flash", "sdpa_cudnn", "sdpa_efficient"]
        if p["n"] > 16384:
            impls = [i for i in impls if i in long_softmax_impls]
        return impls
    if fam == "cosine_sim":
        return ["torch_l2norm_sdpa"]
    if fam in LINEAR:
        return ["torch_taylor", "fla_parallel_based"] if fam == "taylor2" else ["torch_taylor"]
    if fam in HYPERBOLIC:
        return ["torch_hyperbolic"]
    return []


def memory_proxy(impl, p):
    """Grows with the memory a baseline needs at a point: B·H·N² for quadratic ones, B·H·N else."""
    n, nq = p["n"], p.get("nq", p["n"])
    return p["batch"] * p["heads"] * (nq * n if impl in QUADRATIC else n)


def oom_key(impl, p):
    return (impl, p["family"], p["dtype"], p["d"], p["causal"], p["pass_"])


# ---------------------------------------------------------------- implementations (torch)

class Skip(Exception):
    pass


def make_fns(torch, F, impl, p, q, k, v, d_o):
    """Return (forward, params) for impl: forward() computes o from the (leaf) q, k, v."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
                "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}
    causal, d = p["causal"], p["d"]
    if impl in backends and is_decode(p):
        return decode_fn(torch, F, sdpa_kernel, backends[impl], p, q, k, v)
    if impl in backends:
        be = backends[impl]

        def fwd():
            with sdpa_kernel([be]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return fwd, "scale=%g" % (1 / math.sqrt(d))
    if impl.startswith("torch_l2norm_sdpa:"):
        be = backends[impl.split(":")[1]]

        def fwd():
            qn = F.normalize(q, dim=-1, eps=COSINE_EPS)
            kn = F.normalize(k, dim=-1, eps=COSINE_EPS)
            with sdpa_kernel([be]):
                return F.scaled_dot_product_attention(qn, kn, v, is_causal=causal, scale=COSINE_SCALE)
        return fwd, "scale=10 l2norm=true eps=1e-6 backend=%s" % impl.split(":")[1]
    if impl == "torch_taylor":
        order = LINEAR[p["family"]]
        scale = 1 / math.sqrt(d)
        fn = taylor_causal if causal else taylor_full
        a = "a=1,1" if order == 1 else "a=1,1,0.5"
        return (lambda: fn(torch, q * scale, k, v, order)), "%s scale=%g einsum chunk=%d" % (
            a, scale, TAYLOR_CHUNK if causal else 0)
    if impl == "torch_hyperbolic":
        score = HYPERBOLIC[p["family"]]
        return (lambda: hyperbolic_eager(torch, q, k, v, score, causal)), \
            "%s c=%g beta=%g agg=euclidean eager materialised" % (score, HYP_CURVATURE, HYP_BETA)
    if impl == "fla_parallel_based":
        if not causal:
            raise Skip("fla parallel_based is causal only")
        try:
            from fla.ops.based import parallel_based
        except Exception as e:  # noqa: BLE001 - any import failure means "not installed here"
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise Skip("fla not importable: %s" % first)
        import inspect
        kw = {}
        sig = inspect.signature(parallel_based).parameters
        if "head_first" in sig:
            kw["head_first"] = True
        if "use_norm" in sig:
            kw["use_norm"] = True
        if "head_first" not in sig:
            # Newer fla takes [B, N, H, D].
            return (lambda: parallel_based(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           **kw).transpose(1, 2)), "fla layout=bnhd"
        return (lambda: parallel_based(q, k, v, **kw)), "fla head_first"
    raise Skip("no implementation `%s`" % impl)


def decode_fn(torch, F, sdpa_kernel, be, p, q, k, v):
    """SDPA on a decode point: q [B, Hq, Nq, D] against k, v [B, Hkv, T, D], causal bottom-right.
    GQA by enable_gqa=True, or by kv heads repeated beforehand where the backend rejects it (tried once,
    untimed). Returns (forward, params); raises Skip when the backend takes neither."""
    kw, mask_note = {}, "mask=none (Nq=1 sees every key)"
    if p["causal"] and p["nq"] > 1:
        from torch.nn.attention.bias import causal_lower_right
        kw["attn_mask"] = causal_lower_right(p["nq"], p["n"])
        mask_note = "mask=causal_lower_right"
    scale = "scale=%g" % (1 / math.sqrt(p["d"]))
    if p["hkv"] == p["heads"]:
        variants = [("", k, v, {})]
    else:
        g = p["heads"] // p["hkv"]
        variants = [("gqa=enable_gqa", k, v, {"enable_gqa": True}),
                    ("gqa=repeat_interleave", k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1), {})]
    errors = []
    for note, kk, vv, extra in variants:
        def fwd(kk=kk, vv=vv, extra=extra):
            with sdpa_kernel([be]):
                return F.scaled_dot_product_attention(q, kk, vv, **kw, **extra)
        try:
            with torch.no_grad():
                fwd()
        except RuntimeError as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            if "out of memory" in msg.lower():
                raise
            errors.append("%s: %s" % (note or "sdpa", msg[:150]))
            continue
        return fwd, " ".join(x for x in (scale, mask_note, note) if x)
    raise Skip("backend rejects the decode call: " + "; ".join(errors))


def hyperbolic_eager(torch, q, k, v, score, causal):
    """docs/math.md §4 on materialised scores: x0 = sqrt(1/c + |x|^2), <q,k>_L = q.k - q0 k0,
    geodesic s = -beta arccosh(max(-c<q,k>_L, 1 + eps)) / sqrt(c), squared Lorentz
    s = -beta (-2/c - 2<q,k>_L); softmax over allowed keys; o = P v (Euclidean aggregation)."""
    c, beta = HYP_CURVATURE, HYP_BETA
    q0 = torch.sqrt(1.0 / c + q.float().pow(2).sum(-1, keepdim=True))
    k0 = torch.sqrt(1.0 / c + k.float().pow(2).sum(-1, keepdim=True))
    lor = torch.matmul(q, k.transpose(-1, -2)).float() - torch.matmul(q0, k0.transpose(-1, -2))
    if score == "geodesic":
        s = torch.acosh(torch.clamp(-c * lor, min=1.0 + ACOSH_EPS)) * (-beta / math.sqrt(c))
    else:
        s = lor * (2.0 * beta) + 2.0 * beta / c
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1).to(v.dtype), v)


def taylor_terms(torch, q, k, v, order):
    """Per-head states of f(s) = 1 + s + s²/2 over all keys (q already scaled)."""
    a0, a1, a2 = TAYLOR_A
    n = k.shape[-2]
    s1 = torch.einsum("bhnd,bhne->bhde", k, v)
    num = a0 * v.sum(-2, keepdim=True) + a1 * torch.einsum("bhnd,bhde->bhne", q, s1)
    den = a0 * n + a1 * torch.einsum("bhnd,bhd->bhn", q, k.sum(-2))
    if order == 2:
        s2 = torch.einsum("bhnd,bhne,bhnf->bhdef", k, k, v)
        num = num + a2 * torch.einsum("bhnd,bhne,bhdef->bhnf", q, q, s2)
        kk = torch.einsum("bhnd,bhne->bhde", k, k)
        den = den + a2 * torch.einsum("bhnd,bhne,bhde->bhn", q, q, kk)
    return num, den


def taylor_full(torch, q, k, v, order):
    num, den = taylor_terms(torch, q, k, v, order)
    return num / den.unsqueeze(-1)


def taylor_causal(torch, q, k, v, order):
    """Chunked causal Taylor: dense f(s) within a chunk, exclusive prefix states across chunks."""
    a0, a1, a2 = TAYLOR_A
    b, h, n, d = q.shape
    c = TAYLOR_CHUNK
    if n % c:
        raise Skip("N=%d is not a multiple of the chunk %d" % (n, c))
    nc = n // c
    qc, kc, vc = (x.reshape(b, h, nc, c, x.shape[-1]) for x in (q, k, v))

    def exclusive(x):  # prefix sum over chunks, excluding the chunk itself
        return torch.cumsum(x, dim=2) - x

    # Within the chunk: W = f(S) masked to j <= i.
    s = torch.einsum("bhcid,bhcjd->bhcij", qc, kc)
    w = a0 + a1 * s + (a2 * s * s if order == 2 else 0)
    w = w * torch.ones(c, c, device=q.device, dtype=q.dtype).tril()
    num = torch.einsum("bhcij,bhcje->bhcie", w, vc)
    den = w.sum(-1)
    # Across chunks: states of all earlier chunks.
    cnt = (torch.arange(nc, device=q.device, dtype=torch.float32) * c).view(1, 1, nc, 1)
    num = num + a0 * exclusive(vc.sum(-2, keepdim=True))
    den = den + a0 * cnt
    s1 = exclusive(torch.einsum("bhcjd,bhcje->bhcde", kc, vc))
    num = num + a1 * torch.einsum("bhcid,bhcde->bhcie", qc, s1)
    den = den + a1 * torch.einsum("bhcid,bhcd->bhci", qc, exclusive(kc.sum(-2)))
    if order == 2:
        s2 = exclusive(torch.einsum("bhcjd,bhcje,bhcjf->bhcdef", kc, kc, vc))
        num = num + a2 * torch.einsum("bhcid,bhcie,bhcdef->bhcif", qc, qc, s2)
        kk = exclusive(torch.einsum("bhcjd,bhcje->bhcde", kc, kc))
        den = den + a2 * torch.einsum("bhcid,bhcie,bhcde->bhci", qc, qc, kk)
    return (num / den.unsqueeze(-1)).reshape(b, h, n, -1)


# ---------------------------------------------------------------- timing

class Device:
    """Where the baselines run: `cuda` (CUDA events, torch's allocator statistics) or `cpu` (host
    clock, no memory statistics): the same code path either way."""

    def __init__(self, torch, kind):
        self.torch, self.kind = torch, kind
        self.cuda = kind == "cuda"
        self.timer = "cuda_event" if self.cuda else "host_clock"

    def name(self):
        if self.cuda:
            return self.torch.cuda.get_device_name(0)
        import platform
        return "cpu: %s (%d threads)" % (platform.processor() or platform.machine(), os.cpu_count() or 1)

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def free_cache(self):
        if self.cuda:
            self.torch.cuda.empty_cache()

    def start_peak(self):
        if not self.cuda:
            return None
        self.free_cache()
        base = self.torch.cuda.memory_allocated()
        self.torch.cuda.reset_peak_memory_stats()
        return base

    def peak_mib(self, base):
        if base is None:
            return None
        return (self.torch.cuda.max_memory_allocated() - base) / 2**20

    def time_calls(self, fn, warmup, runs):
        torch = self.torch
        for _ in range(warmup):
            fn()
        self.sync()
        if not self.cuda:
            out = []
            for _ in range(runs):
                t = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t) * 1e3)
            return out
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
        for i in range(runs):
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def quantile(sorted_x, q):
    if len(sorted_x) == 1:
        return sorted_x[0]
    pos = q * (len(sorted_x) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_x) - 1)
    return sorted_x[lo] + (sorted_x[hi] - sorted_x[lo]) * (pos - lo)


def measure(dev, F, impl, p, args):
    """(samples_ms, peak_mib, params) for one baseline at one point; raises Skip."""
    torch = dev.torch
    dt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[p["dtype"]]
    b, h, n, d = p["batch"], p["heads"], p["n"], p["d"]
    hkv, nq = p["hkv"], p["nq"]
    base = dev.start_peak()
    g = torch.Generator(device=dev.kind).manual_seed(args.seed)
    need_grad = p["pass_"] != "fwd"

    def rand(*shape):
        return (torch.rand(*shape, device=dev.kind, dtype=torch.float32, generator=g) * 2 - 1).to(dt)

    q = rand(b, h, nq, d).requires_grad_(need_grad)
    k, v = (rand(b, hkv, n, d).requires_grad_(need_grad) for _ in range(2))
    d_o = rand(b, h, nq, d)
    fwd, params = make_fns(torch, F, impl, p, q, k, v, d_o)
    if p["pass_"] == "fwd":
        def call():
            with torch.no_grad():
                return fwd()
    elif p["pass_"] == "fwd_bwd":
        def call():
            q.grad = k.grad = v.grad = None
            fwd().backward(d_o)
    else:
        o = fwd()

        def call():
            q.grad = k.grad = v.grad = None
            o.backward(d_o, retain_graph=True)
    def one_call():
        t0 = time.perf_counter()
        call()
        dev.sync()
        return time.perf_counter() - t0

    first = one_call()
    peak = dev.peak_mib(base)
    warmup = max(args.warmup - 1, 0)
    est = first * (warmup + args.runs)
    if est > args.max_point_s:
        # A first call may include one-time work (fla's Triton kernels compile and autotune in it: 0.5 to
        # 1.7 s on the H100 whatever N): the estimate takes a second call's time before skipping.
        second = one_call()
        warmup = max(warmup - 1, 0)
        est = second * (warmup + args.runs)
        if est > args.max_point_s:
            raise Skip("one call took %.3f s (the first %.3f s): warm-up and %d runs would take ~%.0f s, over "
                       "the %g s per-point budget" % (second, first, args.runs, est, args.max_point_s))
    samples = dev.time_calls(call, warmup, args.runs)
    return samples, peak, params


def oom_reason(p):
    if is_decode(p):
        return "out of memory at Nq=%d Nk=%d (B=%d, Hq=%d, Hkv=%d, D=%d)" % (
            p["nq"], p["n"], p["batch"], p["heads"], p["hkv"], p["d"])
    return "out of memory at N=%d (B=%d, H=%d, D=%d)" % (p["n"], p["batch"], p["heads"], p["d"])


def run_one(dev, F, impl, p, args):
    """(result, reason, out_of_memory)."""
    torch = dev.torch
    oom_error = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", MemoryError)
    try:
        return measure(dev, F, impl, p, args), None, False
    except Skip as e:
        return None, str(e), False
    except (oom_error, MemoryError):
        return None, oom_reason(p), True
    except RuntimeError as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "out of memory" in msg.lower():
            return None, oom_reason(p), True
        return None, "error: " + msg[:300], False
    finally:
        dev.free_cache()


# ---------------------------------------------------------------- definitions checked against ours

CHECK_TOL = 0.05  # bf16 outputs (2^-8 rounding, bf16 P·V) against the f64 reference on the same inputs


def check_definitions(dev, F, families_impls, bin_path):
    """Each baseline once at B=1, H=2, N=128, D=64 (bf16, causal and not) against `attn-bench check`
    (attn-cpu-ref) on the same inputs, so that a ratio compares the same function. Returns one dict
    per (baseline, family, causal): max |o - o_ref| or why it was not checked."""
    import subprocess
    import tempfile
    from safetensors.torch import load_file, save_file
    torch = dev.torch
    results = []
    for family in sorted(families_impls):
        for causal in (False, True):
            p = dict(family=family, dtype="bf16", pass_="fwd", batch=1, heads=2, n=128, d=64, causal=causal)
            g = torch.Generator(device=dev.kind).manual_seed(7)
            q, k, v = ((torch.rand(1, 2, 128, 64, device=dev.kind, generator=g) * 2 - 1).to(torch.bfloat16)
                       for _ in range(3))
            with tempfile.TemporaryDirectory() as d:
                inp, outp = os.path.join(d, "in.safetensors"), os.path.join(d, "out.safetensors")
                save_file({"q": q.float().cpu().contiguous(), "k": k.float().cpu().contiguous(),
                           "v": v.float().cpu().contiguous()}, inp)
                cmd = [bin_path, "check", "--input", inp, "--output", outp, "--family", family, "--layout", "bhnd",
                       "--causal", "top-left" if causal else "none"]
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
                ref = load_file(outp)["o"].to(dev.kind) if r.returncode == 0 else None
            for impl in sorted(families_impls[family]):
                entry = {"impl": impl, "family": family, "causal": causal}
                if ref is None:
                    entry["error"] = "reference failed: " + (r.stderr.strip().splitlines() or ["?"])[-1][:200]
                    results.append(entry)
                    continue
                variants = (["torch_l2norm_sdpa:" + b for b in ("sdpa_cudnn", "sdpa_flash", "sdpa_efficient")]
                            if impl == "torch_l2norm_sdpa" else [impl])
                errors = []
                for variant in variants:
                    try:
                        fwd, _ = make_fns(torch, F, variant, p, q, k, v, None)
                        with torch.no_grad():
                            o = fwd().float()
                        entry["max_abs_diff"] = (o - ref).abs().max().item()
                        entry["ok"] = entry["max_abs_diff"] <= CHECK_TOL
                        break
                    except Exception as e:  # noqa: BLE001 - any failure is reported, not raised
                        errors.append("%s: %s" % (variant, (str(e).splitlines() or [type(e).__name__])[0][:150]))
                if "max_abs_diff" not in entry:
                    entry["error"] = "; ".join(errors)
                results.append(entry)
    return results


def describe_check(c):
    where = "%s %s%s" % (c["impl"], c["family"], " causal" if c["causal"] else "")
    if "error" in c:
        return "check %s: not checked (%s)" % (where, c["error"])
    return "check %s: max |o - o_ref| = %.2e %s" % (where, c["max_abs_diff"], "ok" if c["ok"] else "MISMATCH")


# ---------------------------------------------------------------- output

def git_commit():
    """ATTN_COMMIT from the environment (the GPU script passes the attn-bench binary's), else git."""
    if os.environ.get("ATTN_COMMIT", "").strip():
        return os.environ["ATTN_COMMIT"].strip()
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=here,
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def key_fields(impl, p):
    return {"impl": impl, "family": p["family"], "dtype": p["dtype"], "pass": p["pass_"], "batch": p["batch"],
            "heads_q": p["heads"], "heads_kv": p.get("hkv", p["heads"]), "seq_q": p.get("nq", p["n"]),
            "seq_k": p["n"], "head_dim": p["d"], "causal": p["causal"]}


def make_row(impl, p, samples, peak, params, ctx):
    s = sorted(samples)
    med = quantile(s, 0.5)
    b, h, n, d = p["batch"], p["heads"], p["n"], p["d"]
    nq, hkv = p.get("nq", n), p.get("hkv", h)
    flops = pass_flops(p["family"], p["pass_"], b, h, n, d, p["causal"], nq=nq)
    row = {"impl": impl, "family": p["family"], "params": params}
    row.update({k: v for k, v in key_fields(impl, p).items() if k not in row})
    row.update({"ms_median": med, "ms_min": s[0], "tflops": flops / (med * 1e-3) / 1e12,
                "tokens_per_s": b * nq / (med * 1e-3), "peak_mib": peak, "gpu": ctx["device"],
                "commit": ctx["commit"], "date": ctx["date"], "ms_spread": quantile(s, 0.75) - quantile(s, 0.25),
                "runs": len(s), "timer": ctx.get("timer", "cuda_event")})
    if peak is not None:
        row["peak_source"] = "torch_max_allocated"
    if p["family"] in LINEAR or nq < n:
        elem = {"f32": 4, "f16": 2, "bf16": 2}[p["dtype"]]
        moved = bytes_moved(p["pass_"], b, h, n, d, elem, nq=nq, hkv=hkv)
        row["bytes_moved"] = moved
        if ctx.get("bandwidth_gbs"):
            row["bandwidth_pct"] = 100 * moved / (med * 1e-3) / (ctx["bandwidth_gbs"] * 1e9)
    return row


def copy_bandwidth_gbs(dev):
    """Best of ten copies of 1 GiB (256 MiB on the CPU), counting bytes read plus bytes written."""
    torch = dev.torch
    elems = (1 << 28) if dev.cuda else (1 << 26)
    x = torch.empty(elems, dtype=torch.float32, device=dev.kind)
    y = torch.empty_like(x)
    ms = min(dev.time_calls(lambda: y.copy_(x), 3, 10))
    del x, y
    dev.free_cache()
    return 2 * elems * 4 / (ms * 1e-3) / 1e9


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    csv = lambda t: (lambda s: [t(x) for x in s.split(",") if x])  # noqa: E731
    ap.add_argument("--out", default="baselines.json")
    ap.add_argument("--points", default="", help="the JSON of `attn-bench plan --out` (replaces the grid options)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: the same code path on the host (a dry run of the GPU script)")
    ap.add_argument("--pythonpath", action="append", default=[],
                    help="a folder appended to sys.path (after the system's packages), e.g. unpacked fla-core")
    ap.add_argument("--check-bin", default="",
                    help="an attn-bench binary: check each baseline's definition against its `check` first")
    ap.add_argument("--max-quadratic-n", type=int, default=131072,
                    help="skip baselines quadratic in N (SDPA, fla, eager hyperbolic) beyond this N")
    ap.add_argument("--families", type=csv(str), default=FAMILIES)
    ap.add_argument("--dtypes", type=csv(str), default=["bf16"])
    ap.add_argument("--head-dims", type=csv(int), default=[64, 128])
    ap.add_argument("--causal", type=csv(lambda s: s.lower() in ("1", "true", "yes")), default=[False, True])
    ap.add_argument("--passes", type=csv(str), default=["fwd", "fwd_bwd"])
    ap.add_argument("--seq-lens", type=csv(int), default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--long-seq-lens", type=csv(int), default=[32768, 65536, 131072])
    ap.add_argument("--long-families", type=csv(str), default=["taylor1", "taylor2", "softmax"])
    ap.add_argument("--long-softmax-impls", type=csv(str), default=["sdpa_cudnn"],
                    help="softmax baselines also run at long N (the crossover reference)")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--heads", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--max-point-s", type=float, default=12.0, help="skip a point predicted slower than this")
    ap.add_argument("--deadline-s", type=float, default=430.0, help="skip what is left after this long")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit (no torch needed)")
    return ap.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    start = time.perf_counter()
    sys.path.extend(args.pythonpath)
    points, bad = load_points(args.points) if args.points else plan(args)
    work = [(impl, p) for p in points for impl in baselines_for(p, args.long_softmax_impls)]
    if args.dry_run:
        for b in bad:
            print("not built:", b)
        for impl, p in work:
            print(impl, p)
        print("%d points, %d (baseline, point) pairs" % (len(points), len(work)))
        return 0

    ctx = {"commit": git_commit(), "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}
    out = {"schema": 1, "device": "", "commit": ctx["commit"], "date": ctx["date"], "bandwidth_gbs": None,
           "rows": [], "skipped": [], "bad_points": bad}

    def flush():
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f, indent=1)
        os.replace(tmp, args.out)

    try:
        import torch
        import torch.nn.functional as F
        if args.device == "cuda" and not torch.cuda.is_available():
            raise ImportError("torch.cuda.is_available() is False")
    except ImportError as e:
        out["device"] = "no GPU" if args.device == "cuda" else "cpu"
        reason = ("PyTorch with CUDA not available: %s" if args.device == "cuda" else "PyTorch not available: %s") % e
        for impl, p in work:
            out["skipped"].append({**key_fields(impl, p), "reason": reason})
        flush()
        print(reason, file=sys.stderr)
        return 0

    dev = Device(torch, args.device)
    ctx["device"] = out["device"] = dev.name()
    ctx["timer"] = dev.timer
    ctx["bandwidth_gbs"] = out["bandwidth_gbs"] = copy_bandwidth_gbs(dev)
    print("%s, torch %s, copy bandwidth %.0f GB/s, %d pairs" % (ctx["device"], torch.__version__,
                                                              ctx["bandwidth_gbs"], len(work)), flush=True)
    if args.check_bin:
        families_impls = {}
        for impl, p in work:
            families_impls.setdefault(p["family"], set()).add(impl)
        try:
            out["baseline_checks"] = check_definitions(dev, F, families_impls, args.check_bin)
        except Exception as e:  # noqa: BLE001 - a failed check must not stop the measurements
            out["baseline_checks"] = [{"error": "checks not run: %s" % e}]
        for c in out["baseline_checks"]:
            print(describe_check(c) if "impl" in c else c["error"], flush=True)
        flush()
    out_of_memory = {}  # oom_key -> (memory proxy, reason) of the smallest point that ran out
    for i, (impl, p) in enumerate(work):
        label = "%s %s %s %s N=%d D=%d B=%d H=%d%s" % (impl, p["family"], p["pass_"], p["dtype"], p["n"], p["d"],
                                                      p["batch"], p["heads"], " causal" if p["causal"] else "")
        if is_decode(p):
            label += " Nq=%d Hkv=%d" % (p["nq"], p["hkv"])
        if time.perf_counter() - start > args.deadline_s:
            out["skipped"].append({**key_fields(impl, p), "reason": "past the %g s deadline of this run"
                                   % args.deadline_s})
            continue
        known = out_of_memory.get(oom_key(impl, p))
        if impl in QUADRATIC and p["n"] > args.max_quadratic_n:
            res, why, oom = None, "quadratic in N: not run beyond N=%d (--max-quadratic-n)" % args.max_quadratic_n, False
        elif known is not None and memory_proxy(impl, p) >= known[0]:
            res, why, oom = None, known[1] + " already", False
        elif impl == "torch_l2norm_sdpa":
            # The fastest SDPA backend after l2-normalisation.
            best, reasons, ooms = None, [], 0
            for be in ("sdpa_cudnn", "sdpa_flash", "sdpa_efficient"):
                res, why, o = run_one(dev, F, "torch_l2norm_sdpa:" + be, p, args)
                ooms += o
                if res is None:
                    reasons.append("%s: %s" % (be, why))
                elif best is None or quantile(sorted(res[0]), 0.5) < quantile(sorted(best[0]), 0.5):
                    best = res
            res, why, oom = best, "; ".join(reasons), best is None and ooms == 3
            if oom:
                why = oom_reason(p)
        else:
            res, why, oom = run_one(dev, F, impl, p, args)
        if oom:
            prev = out_of_memory.get(oom_key(impl, p))
            if prev is None or memory_proxy(impl, p) < prev[0]:
                out_of_memory[oom_key(impl, p)] = (memory_proxy(impl, p), why)
        if res is None:
            out["skipped"].append({**key_fields(impl, p), "reason": why})
            print("[%d/%d] %s: skipped: %s" % (i + 1, len(work), label, why), flush=True)
        else:
            row = make_row(impl, p, *res, ctx)
            out["rows"].append(row)
            print("[%d/%d] %s: %.3f ms, %.1f TFLOP/s" % (i + 1, len(work), label, row["ms_median"], row["tflops"]),
                  flush=True)
        flush()
    flush()
    print("%d rows, %d skipped, %.0f s" % (len(out["rows"]), len(out["skipped"]), time.perf_counter() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
