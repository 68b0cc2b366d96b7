"""Checks of run_baselines.py's plan and formulas that need no GPU and no torch:
python3 -m unittest attn-bench/python/test_run_baselines.py"""

import importlib.util
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_baselines as rb  # noqa: E402


class PlanAndFormulas(unittest.TestCase):
    def test_default_grid_matches_the_rust_flash_preset(self):
        points, bad = rb.plan(rb.parse_args([]))
        # Same count as attn-bench's grid test: 6·2·2·6·2 regular + 3·2·2·3·2 long-N points.
        self.assertEqual(len(points), 288 + 72)
        self.assertEqual(bad, [])
        for p in points:
            self.assertEqual(p["heads"] * p["d"], 2048)
            self.assertEqual(p["batch"], max(1, 16384 // p["n"]))
        # Long N comes last, so a deadline cuts the long tail first.
        first_long = next(i for i, p in enumerate(points) if p["n"] > 16384)
        self.assertTrue(all(p["n"] > 16384 for p in points[first_long:]))

    def test_bad_points_and_unknown_families_are_reported(self):
        args = rb.parse_args(["--families", "softmax,nope", "--head-dims", "64,96", "--seq-lens", "1024",
                              "--long-seq-lens", ""])
        points, bad = rb.plan(args)
        self.assertEqual(len(points), 2 * 2)  # D=64 only: 2 causal × 2 passes
        self.assertTrue(any("unknown family `nope`" in b for b in bad))
        self.assertTrue(any("not a multiple of head dim 96" in b for b in bad))

    def test_flops_and_bytes_follow_flops_rs(self):
        self.assertEqual(rb.pass_flops("softmax", "fwd", 1, 8, 1024, 64, False), 4 * 8 * 1024 * 1024 * 64)
        self.assertEqual(rb.pass_flops("cosine_sim", "fwd_bwd", 1, 8, 1024, 64, True),
                         3.5 * 2 * 8 * 1024 * 1024 * 64)
        self.assertEqual(rb.pass_flops("taylor1", "fwd", 1, 32, 16384, 64, False), 2 * 32 * 32768 * 65 * 65)
        self.assertEqual(rb.pass_flops("taylor2", "bwd", 3, 4, 77, 16, False), 2 * 2 * 3 * 4 * 154 * 153 * 17)
        self.assertEqual(rb.bytes_moved("fwd", 1, 32, 16384, 64, 2), 4 * 32 * 16384 * 64 * 2 + 32 * 16384 * 4)

    def test_baselines_per_family(self):
        p = {"family": "softmax", "n": 65536}
        self.assertEqual(rb.baselines_for(p, ["sdpa_cudnn"]), ["sdpa_cudnn"])
        self.assertEqual(rb.baselines_for({"family": "taylor2", "n": 1024}, []),
                         ["torch_taylor", "fla_parallel_based"])
        for fam in ("hyperbolic_geodesic", "hyperbolic_sq_lorentz"):
            self.assertEqual(rb.baselines_for({"family": fam, "n": 1024}, []), ["torch_hyperbolic"])
        self.assertEqual(rb.baselines_for({"family": "cosine_sim", "n": 1024}, []), ["torch_l2norm_sdpa"])

    def test_points_file_of_attn_bench_plan(self):
        plan = {"preset": "h100", "sections": ["memory"], "bad_points": ["x: y"], "points": [
            {"section": "memory", "family": "softmax", "dtype": "bf16", "pass": "fwd_bwd", "batch": 1,
             "heads_q": 8, "heads_kv": 8, "seq": 131072, "head_dim": 128, "causal": True},
            {"section": "memory", "family": "taylor2", "dtype": "bf16", "pass": "fwd_bwd", "batch": 1,
             "heads_q": 8, "heads_kv": 8, "seq": 1048576, "head_dim": 64, "causal": True}]}
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "plan.json")
            with open(path, "w") as f:
                json.dump(plan, f)
            points, bad = rb.load_points(path)
        self.assertEqual(bad, ["x: y"])
        self.assertEqual([(p["family"], p["n"], p["heads"], p["d"], p["causal"], p["pass_"]) for p in points],
                         [("softmax", 131072, 8, 128, True, "fwd_bwd"), ("taylor2", 1048576, 8, 64, True, "fwd_bwd")])
        # Softmax beyond 16k runs only the long-N baselines; quadratic fla is capped by N.
        self.assertEqual(rb.baselines_for(points[0], ["sdpa_cudnn"]), ["sdpa_cudnn"])
        self.assertIn("fla_parallel_based", rb.QUADRATIC)
        self.assertGreater(points[1]["n"], rb.parse_args([]).max_quadratic_n)

    def test_memory_proxy_orders_points_by_what_they_materialise(self):
        small = {"family": "hyperbolic_geodesic", "batch": 4, "heads": 32, "n": 4096}
        large = {"family": "hyperbolic_geodesic", "batch": 2, "heads": 32, "n": 8192}
        # On the FlashAttention grid B·N is fixed, so B·H·N² grows with N for quadratic baselines
        # and stays flat for the linear ones.
        self.assertLess(rb.memory_proxy("torch_hyperbolic", small), rb.memory_proxy("torch_hyperbolic", large))
        self.assertEqual(rb.memory_proxy("torch_taylor", small), rb.memory_proxy("torch_taylor", large))

    def test_commit_comes_from_the_environment_first(self):
        old = os.environ.get("ATTN_COMMIT")
        os.environ["ATTN_COMMIT"] = "abc123def456"
        try:
            self.assertEqual(rb.git_commit(), "abc123def456")
        finally:
            if old is None:
                del os.environ["ATTN_COMMIT"]
            else:
                os.environ["ATTN_COMMIT"] = old

    def test_without_torch_every_pair_is_skipped_with_the_reason(self):
        if importlib.util.find_spec("torch") is not None:
            self.skipTest("torch is installed here")
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "b.json")
            rb.main(["--out", out, "--families", "softmax", "--seq-lens", "512", "--long-seq-lens", ""])
            with open(out) as f:
                data = json.load(f)
        self.assertEqual(data["schema"], 1)
        self.assertEqual(data["rows"], [])
        self.assertEqual(len(data["skipped"]), 3 * 2 * 2 * 2)
        self.assertTrue(all("PyTorch with CUDA not available" in s["reason"] for s in data["skipped"]))

    def test_cpu_device_without_torch_skips_with_the_reason(self):
        if importlib.util.find_spec("torch") is not None:
            self.skipTest("torch is installed here")
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "b.json")
            rb.main(["--out", out, "--device", "cpu", "--families", "hyperbolic_geodesic", "--seq-lens", "64",
                     "--long-seq-lens", "", "--causal", "false", "--passes", "fwd"])
            with open(out) as f:
                data = json.load(f)
        self.assertEqual(data["device"], "cpu")
        self.assertEqual([s["impl"] for s in data["skipped"]], ["torch_hyperbolic", "torch_hyperbolic"])
        self.assertTrue(all("PyTorch not available" in s["reason"] for s in data["skipped"]))

    def test_definition_checks_are_described_with_their_verdict(self):
        ok = {"impl": "torch_taylor", "family": "taylor2", "causal": True, "max_abs_diff": 0.004, "ok": True}
        bad = {"impl": "torch_hyperbolic", "family": "hyperbolic_geodesic", "causal": False,
               "max_abs_diff": 0.3, "ok": False}
        skipped = {"impl": "fla_parallel_based", "family": "taylor2", "causal": False,
                   "error": "fla_parallel_based: fla parallel_based is causal only"}
        self.assertTrue(rb.describe_check(ok).endswith("4.00e-03 ok"))
        self.assertTrue(rb.describe_check(bad).endswith("MISMATCH"))
        self.assertIn("not checked (fla_parallel_based: fla parallel_based is causal only)",
                      rb.describe_check(skipped))
        self.assertIn("taylor2 causal", rb.describe_check(ok))

    DECODE_PLAN = {"preset": "decode", "sections": ["decode", "decode-paged"], "bad_points": [], "points": [
        {"section": "decode", "family": "softmax", "dtype": "bf16", "pass": "fwd", "batch": 1, "heads_q": 32,
         "heads_kv": 8, "seq": 32768, "seq_q": 1, "seq_k": 32768, "head_dim": 128, "causal": True},
        {"section": "decode", "family": "softmax", "dtype": "bf16", "pass": "fwd", "batch": 1, "heads_q": 32,
         "heads_kv": 8, "seq": 16384, "seq_q": 128, "seq_k": 16384, "head_dim": 128, "causal": True},
        {"section": "decode-paged", "family": "softmax", "dtype": "bf16", "pass": "fwd", "batch": 1,
         "heads_q": 32, "heads_kv": 8, "seq": 32768, "seq_q": 1, "seq_k": 32768, "head_dim": 128,
         "causal": True, "page_size": 16}]}

    def load_decode_plan(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "plan.json")
            with open(path, "w") as f:
                json.dump(self.DECODE_PLAN, f)
            return rb.load_points(path)

    def test_decode_points_of_attn_bench_plan(self):
        points, bad = self.load_decode_plan()
        self.assertEqual(bad, [])
        self.assertEqual([(p["batch"], p["heads"], p["hkv"], p["nq"], p["n"], p["d"], p["page_size"]) for p in points],
                         [(1, 32, 8, 1, 32768, 128, None), (1, 32, 8, 128, 16384, 128, None),
                          (1, 32, 8, 1, 32768, 128, 16)])
        self.assertTrue(all(rb.is_decode(p) for p in points))
        # The three SDPA backends on every contiguous point, whatever T; none on a paged one.
        for p in points[:2]:
            self.assertEqual(rb.baselines_for(p, ["sdpa_cudnn"]), ["sdpa_cudnn", "sdpa_flash", "sdpa_efficient"])
        self.assertEqual(rb.baselines_for(points[2], ["sdpa_cudnn"]), [])
        k = rb.key_fields("sdpa_cudnn", points[1])
        self.assertEqual((k["heads_q"], k["heads_kv"], k["seq_q"], k["seq_k"]), (32, 8, 128, 16384))

    def test_decode_formulas_follow_flops_rs(self):
        # One query against 32768 keys sees every key; 128 queries bottom-right lose 128·127/2 pairs.
        self.assertEqual(rb.pass_flops("softmax", "fwd", 1, 32, 32768, 128, True, nq=1), 4 * 32 * 32768 * 128)
        f = rb.pass_flops("softmax", "fwd", 1, 32, 16384, 128, True, nq=128)
        self.assertEqual(f, 4 * 32 * 128 * 128 * (16384 - 127 / 2))
        # K and V of 8 kv heads once, q and o of 32 query heads, the LSE (as the Rust plan test).
        kv = 2 * 8 * 32768 * 128 * 2
        self.assertEqual(rb.bytes_moved("fwd", 1, 32, 32768, 128, 2, nq=1, hkv=8), kv + 2 * 32 * 128 * 2 + 32 * 4)

    def test_decode_row_reports_the_copy_bandwidth_share(self):
        points, _ = self.load_decode_plan()
        ctx = {"device": "gpu", "commit": "c", "date": "d", "bandwidth_gbs": 4000.0}
        row = rb.make_row("sdpa_cudnn", points[0], [0.04, 0.04, 0.05], 10.0, "scale=0.0884 gqa=enable_gqa", ctx)
        moved = rb.bytes_moved("fwd", 1, 32, 32768, 128, 2, nq=1, hkv=8)
        self.assertEqual(row["bytes_moved"], moved)
        self.assertAlmostEqual(row["bandwidth_pct"], 100 * moved / 0.04e-3 / 4000e9)
        self.assertEqual((row["seq_q"], row["seq_k"], row["heads_kv"]), (1, 32768, 8))
        self.assertEqual(row["tokens_per_s"], 1 / 0.04e-3)

    def test_decode_plan_without_torch_skips_each_backend_with_the_reason(self):
        if importlib.util.find_spec("torch") is not None:
            self.skipTest("torch is installed here")
        with tempfile.TemporaryDirectory() as d:
            path, out = os.path.join(d, "plan.json"), os.path.join(d, "b.json")
            with open(path, "w") as f:
                json.dump(self.DECODE_PLAN, f)
            rb.main(["--points", path, "--device", "cpu", "--out", out])
            with open(out) as f:
                data = json.load(f)
        self.assertEqual(len(data["skipped"]), 2 * 3)
        self.assertEqual(sorted({(s["seq_q"], s["seq_k"], s["heads_kv"]) for s in data["skipped"]}),
                         [(1, 32768, 8), (128, 16384, 8)])

    def test_quantile_matches_timing_rs(self):
        self.assertEqual(rb.quantile([1.0, 2.0, 3.0, 4.0], 0.5), 2.5)
        self.assertEqual(rb.quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.25), 2.0)


if __name__ == "__main__":
    unittest.main()
