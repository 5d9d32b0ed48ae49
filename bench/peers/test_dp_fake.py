"""Runs torch_dp.py (the PyTorch data-parallel peer) end to end against the
TEST FAKES in testdata/fakes: numpy stand-ins for torch and for
torch.distributed, whose ranks are real processes that sum their buffers
through files (see testdata/fakes/torch/distributed.py). Launched as
torchrun would launch them (RANK, WORLD_SIZE, LOCAL_RANK). Checks the
peer's control flow, its JSON (rank 0's rows with every rank's times), and
that its check of the weights against the numpy reference holds with the
ranks' gradients summed and fails without. Times are meaningless and not
asserted on. Skipped where numpy is missing.

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
NAMES = ["torch-graph-fixed", "torch-eager", "torch-graph-copy"]


@unittest.skipIf(importlib.util.find_spec("numpy") is None, "numpy is not installed")
class DPPeerOnFakesTest(unittest.TestCase):
    def run_ranks(self, world, *extra, env=None):
        """torch_dp.py on world ranks (no rank variables for world 0: a
        plain single process); rank 0's JSON and every process."""
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "dp.json")
            procs = []
            for r in range(max(world, 1)):
                e = dict(os.environ, PYTHONPATH=FAKES, FAKE_DIST_DIR=d, **(env or {}))
                for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
                    e.pop(k, None)
                if world:
                    e.update(RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), TORCHELASTIC_RUN_ID="fake")
                procs.append(subprocess.Popen(
                    [sys.executable, os.path.join(HERE, "torch_dp.py"), "--steps", "5", "--warmup", "1",
                     "--batch", "2", "--json", out, *extra],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e))
            results = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
            doc = None
            if os.path.exists(out):
                with open(out) as f:
                    doc = json.load(f)
            return doc, results

    def check_doc(self, doc, results, world, rows, scaling):
        for r, (_, err, rc) in enumerate(results):
            self.assertEqual(rc, 0, f"rank {r}: {err[-3000:]}")
        self.assertEqual(doc["system"], "pytorch")
        self.assertEqual(doc["workload"], "dp")
        self.assertEqual(doc["shape"]["ranks"], max(world, 1))
        self.assertEqual(doc["shape"]["batch_per_rank"], rows)
        self.assertEqual(doc["shape"]["batch"], rows * max(world, 1))
        self.assertEqual(doc["shape"]["scaling"], scaling)
        self.assertEqual([r["strategy"] for r in doc["results"]], NAMES)
        for res in doc["results"]:
            self.assertNotIn("error", res, res.get("traceback"))
            self.assertEqual(res["floor"], "torch-graph-fixed")
            self.assertEqual([x["rank"] for x in res["ranks"]], list(range(max(world, 1))))
            for x in res["ranks"]:
                for k in ("step_us", "batch_us", "host_us", "gpu_us"):
                    self.assertEqual(set(x[k]), {"p50", "p90", "n"}, (res["strategy"], k))
            self.assertTrue(res["output_ok"], (res["strategy"], res.get("max_abs_err"), res.get("note")))
            self.assertLess(res["max_abs_err"], 1e-5)
            self.assertEqual(res["input_addresses"], 1 if res["strategy"] == res["floor"] else 2)

    def test_two_ranks_weak(self):
        doc, results = self.run_ranks(2, "--batch-per-rank", "4")
        self.check_doc(doc, results, 2, 4, "weak")
        self.assertEqual(doc["launch"], "torchrun")

    def test_four_ranks_strong(self):
        doc, results = self.run_ranks(4, "--global-batch", "8", "--system", "torch-graph-copy")
        for r, (_, err, rc) in enumerate(results):
            self.assertEqual(rc, 0, f"rank {r}: {err[-3000:]}")
        self.assertEqual(doc["shape"]["batch_per_rank"], 2)
        self.assertEqual([r["strategy"] for r in doc["results"]], ["torch-graph-fixed", "torch-graph-copy"])
        self.assertTrue(all(r["output_ok"] for r in doc["results"]), doc["results"])

    def test_one_process_without_torchrun(self):
        doc, results = self.run_ranks(0)
        self.check_doc(doc, results, 0, 8, "strong")
        self.assertEqual(doc["launch"], "single process")

    def test_check_fails_without_the_all_reduce(self):
        # The ranks' gradients are not summed: each rank steps on its own
        # shard's gradient alone, which the reference over the global batch
        # catches (and the ranks' weights differ).
        doc, results = self.run_ranks(2, "--system", "torch-eager", env={"FAKE_DIST_BROKEN": "1"})
        rows = {r["strategy"]: r for r in doc["results"]}
        self.assertFalse(rows["torch-eager"]["output_ok"])
        self.assertIn("differ", rows["torch-eager"]["note"])

    def test_batch_that_does_not_split(self):
        doc, results = self.run_ranks(2, "--global-batch", "7")
        self.assertTrue(all(rc == 2 for _, _, rc in results), results)
        self.assertIn("does not split into 2", results[0][1])


class DPPeerWithoutGPUTest(unittest.TestCase):
    def test_records_why_it_cannot_run(self):
        # No fakes: torch is missing here, or has no GPU. Either way the JSON
        # says why and the exit status is 2.
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "dp.json")
            env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "PYTHONPATH")}
            p = subprocess.run([sys.executable, os.path.join(HERE, "torch_dp.py"), "--steps", "2", "--json", out],
                               capture_output=True, text=True, timeout=300, env=env)
            self.assertEqual(p.returncode, 2, p.stderr[-2000:])
            with open(out) as f:
                doc = json.load(f)
            self.assertEqual(doc["system"], "pytorch")
            self.assertEqual(doc["workload"], "dp")
            self.assertTrue(doc["error"])
            self.assertEqual(doc["results"], [])


if __name__ == "__main__":
    unittest.main()
