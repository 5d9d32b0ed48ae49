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
    # TEST FAKE of `stablegraph bench`: fabricated numbers, report JSON format.
    import json, sys
    args = sys.argv[1:]
    if "--plot" in args:
        print("flag provided but not defined: -plot", file=sys.stderr)
        sys.exit(2)
    def val(flag, default=None):
        return args[args.index(flag) + 1] if flag in args else default
    fixed = val("--movement") == "fixed"
    base = 50.0 if fixed else 60.0
    doc = {{"backend": "cuda", "device": "FAKE GPU", "workload": val("--workload") + " (fake shape)",
           "steps": int(val("--steps")), "results": [
             {{"strategy": s, "step_us": {{"p50": base * k, "p90": base * k + 1}},
              "host_us": {{"p50": 5.0, "p90": 6.0}}, "rerecords": 0, "graph_updates": 0,
              "patched_nodes": 0, "bytes_copied": 0, "peak_device_bytes": 1048576,
              "outputs_match_eager": True}} for s, k in (("eager", 5), ("patch", 1))]}}
    if fixed:
        doc["movement"] = "fixed"
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
                f.write(FAKE_SG.format(python=sys.executable))
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
                self.assertEqual(patch["floor"], "patch-fixed")
                self.assertAlmostEqual(patch["gpu_ratio"], 1.2)
                for f in ("stablegraph.log", "stablegraph-fixed.json", "torch.json", "jax.json", "jax.log"):
                    self.assertTrue(os.path.exists(os.path.join(out, w, f)), (w, f))
            with open(os.path.join(out, "summary.txt")) as f:
                summary = f.read()
            self.assertIn("== chain ==", summary)
            # The fakes have no libcuda: the update strategy's failure is listed, not fatal.
            self.assertIn("torch peers", summary)


if __name__ == "__main__":
    unittest.main()
