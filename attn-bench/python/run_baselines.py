#!/usr/bin/env python3
"""PyTorch baselines for attn-bench, on the GPU machine, in attn-bench's JSON schema (schema 1).

Same grid as `attn-bench run` (BENCHMARKS.md's FlashAttention convention: 16k tokens per batch,
hidden 2048, N 512..16384, long N for the linear family and softmax), same FLOP formulas, same row
fields. Baselines per family:

- softmax: sdpa_flash, sdpa_cudnn, sdpa_efficient (torch.nn.attention.sdpa_kernel, one backend each);
- cosine_sim: torch_l2norm_sdpa = F.normalize(q), F.normalize(k), then SDPA(scale=10) with the fastest
  of the three backends at that point (the backend is named in `params`);
- taylor1 / taylor2: torch_taylor = the factorised states in torch.einsum (non-causal: global states;
  causal: chunks of 64, dense within a chunk, prefix states across chunks); fla_parallel_based
  (order 2, causal only) when `fla` imports.
Hyperbolic families have no PyTorch baseline here.

Every (baseline, point) that cannot run is written to `skipped` with the reason (backend not
available, out of memory, too slow for the per-point budget, past the global deadline): never as a
zero. Rows are flushed to the output after every point, so a run cut short keeps what it measured.

Usage (GPU machine): python3 run_baselines.py --out $OUT/baselines-h100.json
         (anywhere):  python3 run_baselines.py --dry-run      # print the plan, no torch needed
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
TAYLOR_A = (1.0, 1.0, 0.5)
COSINE_SCALE = 10.0
COSINE_EPS = 1e-6
TAYLOR_CHUNK = 64


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
    return f / 2 if causal else f


def taylor_features(order, d):
    return 1 + d if order == 1 else 1 + d + d * (d + 1) // 2


def pass_flops(family, pass_, b, h, n, d, causal):
    if family in LINEAR:
        fwd = 2.0 * b * h * (n + n) * taylor_features(LINEAR[family], d) * (d + 1)
        return fwd * {"fwd": 1.0, "bwd": 2.0, "fwd_bwd": 3.0}[pass_]
    fwd = softmax_fwd_flops(b, h, n, n, d, d, causal)
    return fwd * {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}[pass_]


def bytes_moved(pass_, b, h, n, d, elem):
    q = k = v = o = b * n * h * d * elem
    stats = b * h * n * 4
    fwd = q + k + v + o + stats
    bwd = q + k + v + 2 * o + stats + q + k + v
    return {"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd + bwd}[pass_]


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
                                     n=n, d=d, causal=causal)
                            (long_ if is_long else regular).append(p)
    points = regular + long_
    return points, bad


def baselines_for(p, long_softmax_impls):
    fam = p["family"]
    if fam == "softmax":
        impls = ["sdpa_flash", "sdpa_cudnn", "sdpa_efficient"]
        if p["n"] > 16384:
            impls = [i for i in impls if i in long_softmax_impls]
        return impls
    if fam == "cosine_sim":
        return ["torch_l2norm_sdpa"]
    if fam in LINEAR:
        return ["torch_taylor", "fla_parallel_based"] if fam == "taylor2" else ["torch_taylor"]
    return []


# ---------------------------------------------------------------- implementations (torch)

class Skip(Exception):
    pass


def make_fns(torch, F, impl, p, q, k, v, d_o):
    """Return (forward, params) for impl: forward() computes o from the (leaf) q, k, v."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
                "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}
    causal, d = p["causal"], p["d"]
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

def time_calls(torch, fn, warmup, runs):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
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


def measure(torch, F, impl, p, args):
    """(samples_ms, peak_mib, params) for one baseline at one point; raises Skip."""
    dt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[p["dtype"]]
    b, h, n, d = p["batch"], p["heads"], p["n"], p["d"]
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    g = torch.Generator(device="cuda").manual_seed(args.seed)
    need_grad = p["pass_"] != "fwd"

    def rand(*shape):
        return (torch.rand(*shape, device="cuda", dtype=torch.float32, generator=g) * 2 - 1).to(dt)

    q, k, v = (rand(b, h, n, d).requires_grad_(need_grad) for _ in range(3))
    d_o = rand(b, h, n, d)
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
    t0 = time.perf_counter()
    call()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    est = first * (args.warmup - 1 + args.runs)
    if est > args.max_point_s:
        raise Skip("one call took %.3f s: warm-up and %d runs would take ~%.0f s, over the %g s per-point budget"
                   % (first, args.runs, est, args.max_point_s))
    samples = time_calls(torch, call, max(args.warmup - 1, 0), args.runs)
    return samples, peak, params


def run_one(torch, F, impl, p, args):
    try:
        return measure(torch, F, impl, p, args), None
    except Skip as e:
        return None, str(e)
    except torch.cuda.OutOfMemoryError:
        return None, "out of memory"
    except RuntimeError as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "out of memory" in msg.lower():
            return None, "out of memory"
        return None, "error: " + msg[:300]
    finally:
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- output

def git_commit():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=here,
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def key_fields(impl, p):
    return {"impl": impl, "family": p["family"], "dtype": p["dtype"], "pass": p["pass_"], "batch": p["batch"],
            "heads_q": p["heads"], "heads_kv": p["heads"], "seq_q": p["n"], "seq_k": p["n"], "head_dim": p["d"],
            "causal": p["causal"]}


def make_row(impl, p, samples, peak, params, ctx):
    s = sorted(samples)
    med = quantile(s, 0.5)
    b, h, n, d = p["batch"], p["heads"], p["n"], p["d"]
    flops = pass_flops(p["family"], p["pass_"], b, h, n, d, p["causal"])
    row = {"impl": impl, "family": p["family"], "params": params}
    row.update({k: v for k, v in key_fields(impl, p).items() if k not in row})
    row.update({"ms_median": med, "ms_min": s[0], "tflops": flops / (med * 1e-3) / 1e12,
                "tokens_per_s": b * n / (med * 1e-3), "peak_mib": peak, "gpu": ctx["device"],
                "commit": ctx["commit"], "date": ctx["date"], "ms_spread": quantile(s, 0.75) - quantile(s, 0.25),
                "runs": len(s), "peak_source": "torch_max_allocated"})
    if p["family"] in LINEAR:
        elem = {"f32": 4, "f16": 2, "bf16": 2}[p["dtype"]]
        moved = bytes_moved(p["pass_"], b, h, n, d, elem)
        row["bytes_moved"] = moved
        if ctx.get("bandwidth_gbs"):
            row["bandwidth_pct"] = 100 * moved / (med * 1e-3) / (ctx["bandwidth_gbs"] * 1e9)
    return row


def copy_bandwidth_gbs(torch):
    """Best of ten device-to-device copies of 1 GiB, counting bytes read plus bytes written."""
    def best_copy_ms():
        x = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
        y = torch.empty_like(x)
        return min(time_calls(torch, lambda: y.copy_(x), 3, 10))
    ms = best_copy_ms()
    torch.cuda.empty_cache()
    return 2 * (1 << 30) / (ms * 1e-3) / 1e9


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    csv = lambda t: (lambda s: [t(x) for x in s.split(",") if x])  # noqa: E731
    ap.add_argument("--out", default="baselines.json")
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
    points, bad = plan(args)
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
        if not torch.cuda.is_available():
            raise ImportError("torch.cuda.is_available() is False")
    except ImportError as e:
        out["device"] = "no GPU"
        reason = "PyTorch with CUDA not available: %s" % e
        for impl, p in work:
            out["skipped"].append({**key_fields(impl, p), "reason": reason})
        flush()
        print(reason, file=sys.stderr)
        return 0

    ctx["device"] = torch.cuda.get_device_name(0)
    out["device"] = ctx["device"]
    ctx["bandwidth_gbs"] = out["bandwidth_gbs"] = copy_bandwidth_gbs(torch)
    print("%s, torch %s, copy bandwidth %.0f GB/s, %d pairs" % (ctx["device"], torch.__version__,
                                                              ctx["bandwidth_gbs"], len(work)), flush=True)
    for i, (impl, p) in enumerate(work):
        label = "%s %s %s %s N=%d D=%d B=%d H=%d%s" % (impl, p["family"], p["pass_"], p["dtype"], p["n"], p["d"],
                                                      p["batch"], p["heads"], " causal" if p["causal"] else "")
        if time.perf_counter() - start > args.deadline_s:
            out["skipped"].append({**key_fields(impl, p), "reason": "past the %g s deadline of this run"
                                   % args.deadline_s})
            continue
        if impl == "torch_l2norm_sdpa":
            # The fastest SDPA backend after l2-normalisation.
            best, reasons = None, []
            for be in ("sdpa_cudnn", "sdpa_flash", "sdpa_efficient"):
                res, why = run_one(torch, F, "torch_l2norm_sdpa:" + be, p, args)
                if res is None:
                    reasons.append("%s: %s" % (be, why))
                elif best is None or quantile(sorted(res[0]), 0.5) < quantile(sorted(best[0]), 0.5):
                    best = res
            res, why = best, "; ".join(reasons)
        else:
            res, why = run_one(torch, F, impl, p, args)
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
