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
        self.assertEqual(rb.baselines_for({"family": "hyperbolic_geodesic", "n": 1024}, []), [])

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

    def test_quantile_matches_timing_rs(self):
        self.assertEqual(rb.quantile([1.0, 2.0, 3.0, 4.0], 0.5), 2.5)
        self.assertEqual(rb.quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.25), 2.0)


if __name__ == "__main__":
    unittest.main()
