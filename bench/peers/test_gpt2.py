"""Tests of the gpt2-decode peer (torch_gpt2.py, gpt2_data.py) without a GPU.

testdata/gpt2 holds a micro gpt2-decode (1 layer, d 16, 2 heads, vocab 32,
16 positions, batch 3, seed 5) written by the Go workload itself: its
weights and the dump of one eager step on stablegraph's sim backend
(`go test ./workload -run TestGPT2PeerFixture -update` rewrites them; that
Go test fails when they go stale). The peer runs here on the numpy TEST
FAKE of torch (testdata/fakes), so what is checked is the peer's model, its
inputs and its control flow against stablegraph's: the fake's times and
memory mean nothing. Skipped where numpy is missing.

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
DUMP = os.path.join(FIXTURE, "eager-b3.safetensors")


@unittest.skipIf(importlib.util.find_spec("numpy") is None, "numpy is not installed")
class GPT2DataTest(unittest.TestCase):
    def setUp(self):
        sys.path.insert(0, HERE)
        import gpt2_data
        self.g = gpt2_data
        w, meta = gpt2_data.read_safetensors(WEIGHTS)
        self.cfg = gpt2_data.Config(w, meta, batch=3)

    def test_config_from_weights_and_metadata(self):
        c = self.cfg
        self.assertEqual((c.layers, c.d, c.heads, c.vocab, c.npos, c.pos, c.seed), (1, 16, 2, 32, 16, 6, 5))
        self.assertEqual([c.seq_pos(s) for s in range(5)], [6, 5, 4, 3, 6])

    def test_tokens_match_the_workload(self):
        dump, meta = self.g.read_safetensors(DUMP)
        self.assertEqual(list(dump["sequences"]), [0, 1, 2])
        self.assertEqual(meta["step"], "0")
        self.assertEqual([self.g.token(self.cfg, 0, s) for s in range(3)], [int(t) for t in dump["tokens"]])
        self.assertEqual([self.cfg.seq_pos(s) for s in range(3)], [int(p) for p in dump["positions"]])

    def test_cache_prefix(self):
        import numpy as np
        pre = self.g.cache_prefix(self.cfg, 1)
        self.assertEqual(pre.shape, (1, 2, 5, 16))
        self.assertEqual(pre.dtype, np.float32)
        self.assertTrue(np.all(pre >= -0.5) and np.all(pre < 0.5))
        self.assertGreater(len(np.unique(pre)), pre.size // 2)  # not a constant
        self.assertFalse(np.array_equal(pre[0, 0, :4], self.g.cache_prefix(self.cfg, 2)[0, 0, :4]))

    def test_bad_config(self):
        w, meta = self.g.read_safetensors(WEIGHTS)
        with self.assertRaises(ValueError):
            self.g.Config(w, meta, batch=3, heads=3)  # 16 is not a multiple of 3
        with self.assertRaises(ValueError):
            self.g.Config(w, meta, batch=3, pos=16)
        with tempfile.NamedTemporaryFile(suffix=".safetensors") as f:
            f.write(b"\x01")
            f.flush()
            with self.assertRaises(ValueError):
                self.g.read_safetensors(f.name)


@unittest.skipIf(importlib.util.find_spec("numpy") is None, "numpy is not installed")
class GPT2PeerOnFakesTest(unittest.TestCase):
    def run_peer(self, *extra):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "out.json")
            env = dict(os.environ, PYTHONPATH=FAKES)
            p = subprocess.run([sys.executable, os.path.join(HERE, "torch_gpt2.py"), "--weights", WEIGHTS,
                                "--batch", "3", "--steps", "4", "--warmup", "1", "--throughput-batch", "2",
                                "--json", out, *extra],
                               capture_output=True, text=True, timeout=300, env=env)
            with open(out) as f:
                return p, json.load(f)

    def test_every_strategy_matches_stablegraph(self):
        p, doc = self.run_peer("--check", DUMP, "--samples")
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assertEqual(doc["system"], "pytorch")
        self.assertEqual(doc["workload"], "gpt2-decode")
        names = ["torch-graph-fixed", "torch-eager", "torch-graph-copy", "torch-graph-swap-copy", "torch-compile"]
        self.assertEqual([r["strategy"] for r in doc["results"]], names)
        for r in doc["results"]:
            self.assertNotIn("error", r, r.get("traceback"))
            self.assertEqual(r["floor"], "torch-graph-fixed")
            self.assertTrue(r["output_ok"], r)
            # float32 numpy against stablegraph's sim: far inside 1e-3.
            self.assertLess(r["max_abs_err_vs_stablegraph"], 1e-5, r["strategy"])
            self.assertEqual(r["step_us"]["n"], 4)
            self.assertEqual(len(r["step_samples_us"]), 4)
        swap = doc["results"][3]
        self.assertEqual(swap["swaps_per_step"], 1)
        self.assertEqual(swap["swap_bytes_per_step"], 2 * 4 * 1 * 2 * 16 * 16)

    def test_a_wrong_model_is_caught(self):
        # Another position gives other logits: the check must fail.
        p, doc = self.run_peer("--check", DUMP, "--pos", "5", "--system", "torch-eager")
        self.assertEqual(p.returncode, 1)
        eager = [r for r in doc["results"] if r["strategy"] == "torch-eager"][0]
        self.assertFalse(eager["output_ok"])
        self.assertIn("differ", eager["note"])

    def test_dump_of_another_batch_refused(self):
        p, doc = self.run_peer("--check", DUMP, "--batch", "2")
        self.assertEqual(p.returncode, 2)
        self.assertIn("not a fixed-pattern step of batch 2", doc["error"])


if __name__ == "__main__":
    unittest.main()
