"""Runs torch_peers.py and jax_peers.py end to end against the TEST FAKES in
testdata/fakes (numpy stand-ins for torch and jax, see the README there).

This checks the peers' control flow, JSON and output check on a machine
without a GPU; the times and memory figures the fakes produce are
meaningless and are not asserted on. Skipped where numpy is missing.

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


@unittest.skipIf(importlib.util.find_spec("numpy") is None, "numpy is not installed")
class PeersOnFakesTest(unittest.TestCase):
    def run_peer(self, script, workload, *extra):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "out.json")
            env = dict(os.environ, PYTHONPATH=FAKES)
            p = subprocess.run([sys.executable, os.path.join(HERE, script), "--workload", workload,
                                "--steps", "6", "--warmup", "1", "--batch", "3", "--chain-k", "8",
                                "--json", out, *extra],
                               capture_output=True, text=True, timeout=300, env=env)
            with open(out) as f:
                return p, json.load(f)

    def check_common(self, doc, system, names):
        self.assertEqual(doc["system"], system)
        self.assertEqual([r["strategy"] for r in doc["results"]], names)
        for r in doc["results"]:
            if "error" in r:
                continue
            for k in ("step_us", "batch_us", "host_us"):
                self.assertEqual(set(r[k]), {"p50", "p90", "n"}, (r["strategy"], k))
            self.assertEqual(r["step_us"]["n"], 6)
            self.assertEqual(r["batch_us"]["n"], 2)
            self.assertIn("peak_device_bytes", r)
            self.assertEqual(r["input_addresses"], 1 if r["strategy"] == r["floor"] else 2, r["strategy"])

    def test_torch(self):
        names = ["torch-graph-fixed", "torch-eager", "torch-graph-copy", "torch-recapture",
                 "torch-recapture-update"]
        for w in ("mlp", "train", "chain"):
            p, doc = self.run_peer("torch_peers.py", w)
            self.check_common(doc, "pytorch", names)
            by = {r["strategy"]: r for r in doc["results"]}
            for n in names[:4]:
                self.assertNotIn("error", by[n], (w, n, p.stderr[-2000:]))
                self.assertEqual(by[n]["floor"], "torch-graph-fixed")
                self.assertIsNotNone(by[n]["gpu_us"])
                self.assertEqual(by[n]["output_ok"], None if w == "train" else True, (w, n))
            # No libcuda here: the update strategy fails alone, with its reason.
            upd = by["torch-recapture-update"]
            if "error" in upd:
                self.assertIn("libcuda", upd["error"])
                self.assertEqual(p.returncode, 1)

    def test_torch_one_strategy_brings_its_floor(self):
        p, doc = self.run_peer("torch_peers.py", "mlp", "--system", "torch-graph-copy", "--samples")
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        self.assertEqual([r["strategy"] for r in doc["results"]], ["torch-graph-fixed", "torch-graph-copy"])
        self.assertEqual(len(doc["results"][1]["step_samples_us"]), 6)

    def test_jax(self):
        names = ["jax-cmdbuf-off-fixed", "jax-cmdbuf-off", "jax-cmdbuf-on-fixed", "jax-cmdbuf-on"]
        for w in ("mlp", "train", "chain"):
            p, doc = self.run_peer("jax_peers.py", w)
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            self.check_common(doc, "jax", names)
            by = {r["strategy"]: r for r in doc["results"]}
            for n in names:
                self.assertIsNone(by[n]["gpu_us"])
                self.assertEqual(by[n]["output_ok"], None if w == "train" else True, (w, n))
            self.assertEqual(by["jax-cmdbuf-off"]["xla_flags"], "--xla_gpu_enable_command_buffer=")
            self.assertEqual(by["jax-cmdbuf-on"]["xla_flags"], "")
            if w != "chain":  # the HLO check is off for chain by default
                self.assertFalse(by["jax-cmdbuf-off"]["hlo_command_buffer"])
                self.assertTrue(by["jax-cmdbuf-on"]["hlo_command_buffer"])

    def test_time_limit_skips_strategies(self):
        p, doc = self.run_peer("torch_peers.py", "mlp", "--time-limit", "0.001")
        errors = [r.get("error", "") for r in doc["results"]]
        self.assertTrue(any(e.startswith("skipped: time limit") for e in errors), errors)


if __name__ == "__main__":
    unittest.main()
