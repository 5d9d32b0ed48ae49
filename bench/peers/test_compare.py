"""Runs bench/compare end to end on this machine with TEST FAKES: a fake
stablegraph binary (a Python script written below that prints fabricated
bench JSON and, like an older binary, rejects --plot) and the numpy stand-ins
for torch and jax in testdata/fakes. Checks the script's plumbing: the
per-workload layout, the --plot retry, the fixed run, the merge. Nothing
here is a measurement. Skipped where numpy or bash is missing.

Run: cd bench/peers && python3 -m unittest -v
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FAKES = os.path.join(HERE, "testdata", "fakes")

FAKE_SG = textwrap.dedent("""\
    #!{python}
    # TEST FAKE of `stablegraph bench` and `stablegraph run`: fabricated
    # numbers in the report JSON format. Like an older binary it rejects
    # --plot. run copies the gpt2 fixture (bench/peers/testdata/gpt2) to
    # --weights (when missing) and --dump, as the real one writes them.
    import json, os, shutil, sys
    args = sys.argv[1:]
    if "--plot" in args:
        print("flag provided but not defined: -plot", file=sys.stderr)
        sys.exit(2)
    def val(flag, default=None):
        return args[args.index(flag) + 1] if flag in args else default
    if "run" in args:
        fixture = {fixture!r}
        if val("--weights") and not os.path.exists(val("--weights")):
            shutil.copy(os.path.join(fixture, "weights.safetensors"), val("--weights"))
        if val("--dump"):
            shutil.copy(os.path.join(fixture, "eager-b3.safetensors"), val("--dump"))
        print("fake run done", file=sys.stderr)
        sys.exit(0)
    rows = (("eager", 300.0), ("patch", 60.0), ("replay-fixed", 50.0))
    doc = {{"backend": "cuda", "device": "FAKE GPU", "workload": val("--workload") + " (fake shape)",
           "steps": int(val("--steps")), "results": [
             {{"strategy": s, "step_us": {{"p50": t, "p90": t + 1}},
              "host_us": {{"p50": 5.0, "p90": 6.0}}, "rerecords": 0, "graph_updates": 0,
              "patched_nodes": 0, "bytes_copied": 0, "peak_device_bytes": 1048576,
              "outputs_match_eager": True}} for s, t in rows]}}
    with open(val("--json"), "w") as f:
        json.dump(doc, f)
    print("fake bench done", file=sys.stderr)
    """)


@unittest.skipIf(importlib.util.find_spec("numpy") is None or shutil.which("bash") is None
                 or shutil.which("timeout") is None, "needs numpy, bash and timeout")
class CompareScriptTest(unittest.TestCase):
    def test_end_to_end_with_fakes(self):
        with tempfile.TemporaryDirectory() as d:
            sg = os.path.join(d, "stablegraph")
            with open(sg, "w") as f:
                f.write(FAKE_SG.format(python=sys.executable, fixture=os.path.join(HERE, "testdata", "gpt2")))
            os.chmod(sg, 0o755)
            out = os.path.join(d, "out")
            env = dict(os.environ, PYTHONPATH=FAKES, SG_BIN=sg, PY=sys.executable, SG_LIBCUBLAS="")
            env.pop("OUT", None)
            p = subprocess.run(["bash", os.path.join(ROOT, "bench", "compare"), "--out", out,
                                "--workloads", "mlp chain", "--steps", "4", "--warmup", "1", "--budget", "240"],
                               capture_output=True, text=True, timeout=600, env=env)
            self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
            self.assertIn("again without it", p.stderr)  # the --plot retry
            with open(os.path.join(out, "merged.json")) as f:
                merged = json.load(f)
            self.assertEqual(list(merged["workloads"]), ["mlp", "chain"])
            for w in ("mlp", "chain"):
                rows = merged["workloads"][w]
                systems = {r["system"] for r in rows}
                self.assertEqual(systems, {"stablegraph", "pytorch", "jax"}, w)
                patch = [r for r in rows if r["system"] == "stablegraph" and r["strategy"] == "patch"][0]
                self.assertEqual(patch["floor"], "replay-fixed")
                self.assertAlmostEqual(patch["gpu_ratio"], 1.2)
                for f in ("stablegraph.log", "torch.json", "jax.json", "jax.log"):
                    self.assertTrue(os.path.exists(os.path.join(out, w, f)), (w, f))
            with open(os.path.join(out, "summary.txt")) as f:
                summary = f.read()
            self.assertIn("== chain ==", summary)
            # The fakes have no libcuda: the update strategy's failure is listed, not fatal.
            self.assertIn("torch peers", summary)

    def test_gpt2_decode_with_fakes(self):
        with tempfile.TemporaryDirectory() as d:
            sg = os.path.join(d, "stablegraph")
            with open(sg, "w") as f:
                f.write(FAKE_SG.format(python=sys.executable, fixture=os.path.join(HERE, "testdata", "gpt2")))
            os.chmod(sg, 0o755)
            out = os.path.join(d, "out")
            env = dict(os.environ, PYTHONPATH=FAKES, SG_BIN=sg, PY=sys.executable, SG_LIBCUBLAS="", SG_PLOT="0")
            env.pop("OUT", None)
            p = subprocess.run(["bash", os.path.join(ROOT, "bench", "compare"), "--out", out,
                                "--workloads", "gpt2-decode", "--gpt2-batches", "3", "--steps", "4", "--warmup", "1",
                                "--budget", "240"],
                               capture_output=True, text=True, timeout=600, env=env)
            self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
            d3 = os.path.join(out, "gpt2-decode-b3")
            for f in ("eager.safetensors", "eager-dump.log", "stablegraph.json", "torch.json", "torch.log"):
                self.assertTrue(os.path.exists(os.path.join(d3, f)), f)
            self.assertTrue(os.path.exists(os.path.join(out, "gpt2-weights.safetensors")))
            self.assertIn("--pattern swap", p.stderr)
            with open(os.path.join(out, "merged.json")) as f:
                merged = json.load(f)
            rows = merged["workloads"]["gpt2-decode-b3"]
            self.assertEqual({r["system"] for r in rows}, {"stablegraph", "pytorch"})
            torch_rows = [r for r in rows if r["system"] == "pytorch"]
            self.assertEqual(len(torch_rows), 5)
            for r in torch_rows:
                self.assertNotIn("error", r, r)
                self.assertIn("logits vs stablegraph eager: max abs", r["note"])
            with open(os.path.join(d3, "torch.json")) as f:
                self.assertTrue(all(r["output_ok"] for r in json.load(f)["results"]))

    def test_dp_with_fakes(self):
        # dp: the fake stablegraph with --nproc, and the PyTorch peer on 2
        # ranks under a fake torchrun (processes with torchrun's variables,
        # the fake torch.distributed between them).
        with tempfile.TemporaryDirectory() as d:
            sg = os.path.join(d, "stablegraph")
            with open(sg, "w") as f:
                f.write(FAKE_SG.format(python=sys.executable, fixture=os.path.join(HERE, "testdata", "gpt2")))
            os.chmod(sg, 0o755)
            torchrun = os.path.join(d, "torchrun")
            with open(torchrun, "w") as f:
                f.write(FAKE_TORCHRUN.format(python=sys.executable))
            os.chmod(torchrun, 0o755)
            out = os.path.join(d, "out")
            env = dict(os.environ, PYTHONPATH=FAKES, SG_BIN=sg, PY=sys.executable, SG_LIBCUBLAS="", SG_PLOT="0",
                       TORCHRUN=torchrun, DP_RANKS="2")
            env.pop("OUT", None)
            p = subprocess.run(["bash", os.path.join(ROOT, "bench", "compare"), "--out", out, "--workloads", "dp",
                                "--steps", "4", "--warmup", "1", "--budget", "400"],
                               capture_output=True, text=True, timeout=600, env=env)
            self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
            self.assertIn("--nproc 2 --batch-per-rank 8", p.stderr)
            with open(os.path.join(out, "merged.json")) as f:
                merged = json.load(f)
            rows = merged["workloads"]["dp-weak-n2"]
            self.assertEqual({r["system"] for r in rows}, {"stablegraph", "pytorch"})
            torch_rows = {r["strategy"]: r for r in rows if r["system"] == "pytorch"}
            self.assertEqual(set(torch_rows), {"torch-graph-fixed", "torch-eager", "torch-graph-copy"})
            with open(os.path.join(out, "dp-weak-n2", "torch.json")) as f:
                doc = json.load(f)
            self.assertEqual(doc["shape"]["ranks"], 2)
            self.assertTrue(all(r["output_ok"] for r in doc["results"]), doc["results"])


# TEST FAKE of `torchrun --standalone --nproc_per_node N SCRIPT ARGS...`: starts
# N Python processes with torchrun's variables and a directory for the fake
# torch.distributed.
FAKE_TORCHRUN = textwrap.dedent("""\
    #!{python}
    import os, subprocess, sys, tempfile
    args = sys.argv[1:]
    n = int(args[args.index("--nproc_per_node") + 1])
    rest = args[args.index("--nproc_per_node") + 2:]
    d = tempfile.mkdtemp()
    procs = [subprocess.Popen([sys.executable] + rest, env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(n),
             LOCAL_RANK=str(r), TORCHELASTIC_RUN_ID="fake", FAKE_DIST_DIR=d)) for r in range(n)]
    sys.exit(max(p.wait() for p in procs))
    """)


if __name__ == "__main__":
    unittest.main()
