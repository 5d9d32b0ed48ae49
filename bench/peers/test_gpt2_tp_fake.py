"""Runs torch_gpt2_tp.py (the tensor-parallel PyTorch peer) end to end against
the TEST FAKES in testdata/fakes (numpy stand-ins for torch and
torch.distributed, whose ranks are real processes summing their buffers
through files), on the micro gpt2-decode of testdata/gpt2 (1 layer, d 16, 2
heads, vocab 32, batch 3; see test_gpt2.py). Checks that the peer's split of
the weights and caches, with the all-reduces, gives the single-GPU eager
step's logits (stablegraph's dump) on 1 and 2 ranks, that a broken all-reduce
is caught, and the JSON (every rank's times, the all-reduce's on its own).
The fakes' times mean nothing and are not asserted on. Skipped where numpy is
missing.

Run: cd bench/peers && python3 -m unittest -v
"""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
FAKES = os.path.join(HERE, "testdata", "fakes")
FIXTURE = os.path.join(HERE, "testdata", "gpt2")
WEIGHTS = os.path.join(FIXTURE, "weights.safetensors")
DUMPS = os.path.join(FIXTURE, "eager-b{batch}.safetensors")
NAMES = ["torch-graph-fixed", "torch-eager", "torch-graph-swap-copy"]


@unittest.skipIf(importlib.util.find_spec("numpy") is None, "numpy is not installed")
class TPPeerOnFakesTest(unittest.TestCase):
    def run_ranks(self, world, *extra, env=None):
        """torch_gpt2_tp.py on world ranks (0: a plain single process);
        rank 0's JSON and every process's (stdout, stderr, status)."""
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "tp.json")
            procs = []
            for r in range(max(world, 1)):
                e = dict(os.environ, PYTHONPATH=FAKES, FAKE_DIST_DIR=d, **(env or {}))
                for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
                    e.pop(k, None)
                if world:
                    e.update(RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), TORCHELASTIC_RUN_ID="fake")
                procs.append(subprocess.Popen(
                    [sys.executable, os.path.join(HERE, "torch_gpt2_tp.py"), "--steps", "3", "--warmup", "1",
                     "--throughput-batch", "2", "--json", out, *extra],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e))
            results = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
            doc = None
            if os.path.exists(out):
                with open(out) as f:
                    doc = json.load(f)
            return doc, results

    def check_rows(self, doc, results, world):
        for r, (_, err, rc) in enumerate(results):
            self.assertEqual(rc, 0, f"rank {r}: {err[-3000:]}")
        self.assertEqual(doc["shape"]["tensor_parallel"], max(world, 1))
        self.assertEqual([r["strategy"] for r in doc["results"]], NAMES)
        for res in doc["results"]:
            self.assertNotIn("error", res, res.get("traceback"))
            self.assertEqual(res["batch"], 3)
            self.assertEqual([x["rank"] for x in res["ranks"]], list(range(max(world, 1))))
            self.assertTrue(res["output_ok"], res)
            # float32 numpy against stablegraph's sim, another summation order: far inside 1e-4.
            self.assertLess(res["max_abs_err_vs_stablegraph"], 1e-5, res["strategy"])

    def test_two_ranks_match_the_single_gpu_step(self):
        doc, results = self.run_ranks(2, "--weights", WEIGHTS, "--batches", "3", "--check", DUMPS)
        self.check_rows(doc, results, 2)
        self.assertEqual(doc["launch"], "torchrun")
        swap = doc["results"][2]
        # One swap a step, each moving a cache of 1 layer x k|v x 16 positions x the rank's 8 columns.
        self.assertEqual(swap["swap_bytes_per_step"], 2 * 1 * 4 * 1 * 2 * 16 * 8)
        ar = doc["allreduce"]
        self.assertEqual([a["batch"] for a in ar], [3])
        self.assertEqual(ar[0]["floats"], 16 * 3)
        self.assertEqual(ar[0]["per_token"], 2)
        for k in ("eager_us", "graph_one_us", "graph_token_us"):
            self.assertEqual(set(ar[0][k]), {"p50", "p90", "n"}, k)
        self.assertIn("error", ar[0]["symm_one_shot"])  # the fake has no symmetric memory

    def test_one_process_is_the_whole_model(self):
        doc, results = self.run_ranks(0, "--weights", WEIGHTS, "--batches", "3", "--check", DUMPS,
                                      "--system", "torch-eager")
        for _, err, rc in results:
            self.assertEqual(rc, 0, err[-3000:])
        self.assertEqual(doc["launch"], "single process")
        self.assertTrue(all(r["output_ok"] for r in doc["results"]), doc["results"])
        self.assertEqual(doc["allreduce"], [])

    def test_a_broken_all_reduce_is_caught(self):
        doc, results = self.run_ranks(2, "--weights", WEIGHTS, "--batches", "3", "--check", DUMPS,
                                      "--system", "torch-eager", env={"FAKE_DIST_BROKEN": "1"})
        eager = [r for r in doc["results"] if r["strategy"] == "torch-eager"][0]
        self.assertFalse(eager["output_ok"])
        self.assertIn("differ", eager["note"])
        self.assertEqual(results[0][2], 1)

    def test_allreduce_only(self):
        doc, results = self.run_ranks(2, "--allreduce-only", "--width", "16", "--layers", "3", "--batches", "1,2")
        for r, (_, err, rc) in enumerate(results):
            self.assertEqual(rc, 0, f"rank {r}: {err[-3000:]}")
        self.assertEqual(doc["results"], [])
        self.assertEqual([(a["batch"], a["floats"], a["per_token"]) for a in doc["allreduce"]], [(1, 16, 6), (2, 32, 6)])

    def test_heads_that_do_not_split(self):
        doc, results = self.run_ranks(4, "--weights", WEIGHTS, "--batches", "3")
        self.assertEqual(results[0][2], 2, results[0][1][-2000:])
        self.assertIn("2 heads do not split over 4 ranks", doc["error"])


@unittest.skipIf(importlib.util.find_spec("numpy") is None, "numpy is not installed")
class ShardTest(unittest.TestCase):
    def test_parts_put_back_together(self):
        import numpy as np
        sys.path.insert(0, HERE)
        import torch_gpt2_tp as tp
        rng = np.random.default_rng(0)
        for name, shape in (("h.0.attn.c_attn.weight", (4, 24)), ("h.0.attn.c_attn.bias", (24,)),
                            ("h.0.mlp.c_fc.weight", (4, 16)), ("h.0.mlp.c_proj.weight", (16, 4)),
                            ("h.0.attn.c_proj.bias", (4,)), ("wte.weight", (5, 4))):
            a = rng.standard_normal(shape).astype(np.float32)
            parts = [tp.shard(name, a, r, 2) for r in range(2)]
            kind, groups = tp.split_of(name)
            if kind == "replicated":
                self.assertTrue(all(np.array_equal(p, a) for p in parts), name)
            elif kind == "rows":
                self.assertTrue(np.array_equal(np.concatenate(parts, axis=0), a), name)
            else:
                w = a.shape[-1] // groups // 2
                back = np.concatenate([parts[r][..., g * w:(g + 1) * w] for g in range(groups) for r in range(2)], axis=-1)
                self.assertTrue(np.array_equal(back, a), name)


if __name__ == "__main__":
    unittest.main()
