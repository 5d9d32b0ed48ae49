"""Tests of merge.py.

TEST FIXTURES: every JSON document in this file is fabricated. The numbers
are made up to exercise the merge (ratios, floors, failures, layouts); they
are not measurements of anything and must not be quoted as results.

Run: cd bench/peers && python3 -m unittest -v
"""

import copy
import io
import json
import os
import tempfile
import unittest
from contextlib import redirect_stdout

import merge

# --- TEST FIXTURE (fabricated): stablegraph `bench --json`, report package format.
FIXTURE_SG = {
    "backend": "cuda", "device": "FAKE GPU 0", "workload": "mlp", "steps": 100,
    "results": [
        {"strategy": "eager", "step_us": {"p50": 300.0, "p90": 320.0}, "host_us": {"p50": 250.0, "p90": 260.0},
         "rerecords": 0, "graph_updates": 0, "patched_nodes": 0, "bytes_copied": 0,
         "peak_device_bytes": 4194304, "outputs_match_eager": True},
        {"strategy": "patch", "step_us": {"p50": 60.0, "p90": 66.0}, "host_us": {"p50": 12.0, "p90": 13.0},
         "rerecords": 0, "graph_updates": 0, "patched_nodes": 1600, "bytes_copied": 0,
         "peak_device_bytes": 4194304, "outputs_match_eager": True},
        {"strategy": "pool", "step_us": {"p50": 0, "p90": 0}, "host_us": {"p50": 0, "p90": 0},
         "rerecords": 0, "graph_updates": 0, "patched_nodes": 0, "bytes_copied": 0,
         "peak_device_bytes": 0, "outputs_match_eager": False, "note": "fell back: no VMM (fabricated)"},
    ],
}

# --- TEST FIXTURE (fabricated): the same bench with --movement fixed.
FIXTURE_SG_FIXED = {
    "backend": "cuda", "device": "FAKE GPU 0", "workload": "mlp", "steps": 100, "movement": "fixed",
    "results": [
        {"strategy": "eager", "step_us": {"p50": 290.0, "p90": 300.0}, "host_us": {"p50": 250.0, "p90": 255.0},
         "peak_device_bytes": 4194304, "outputs_match_eager": True},
        {"strategy": "patch", "step_us": {"p50": 50.0, "p90": 52.0}, "host_us": {"p50": 5.0, "p90": 6.0},
         "peak_device_bytes": 4194304, "outputs_match_eager": True},
    ],
}

# --- TEST FIXTURE (fabricated): torch_peers.py output, one strategy failed.
FIXTURE_TORCH = {
    "system": "pytorch", "device": "FAKE GPU 0", "versions": {"torch": "0.0-fixture"}, "workload": "mlp",
    "dtype": "float32",
    "results": [
        {"strategy": "torch-graph-fixed", "floor": "torch-graph-fixed", "dtype": "float32",
         "step_us": {"p50": 55.0, "p90": 58.0, "n": 100}, "batch_us": {"p50": 50.0, "p90": 51.0, "n": 2},
         "host_us": {"p50": 5.0, "p90": 6.0, "n": 100}, "gpu_us": {"p50": 48.0, "p90": 49.0, "n": 100},
         "peak_device_bytes": 8388608},
        {"strategy": "torch-graph-copy", "floor": "torch-graph-fixed", "dtype": "float32",
         "step_us": {"p50": 66.0, "p90": 70.0, "n": 100}, "batch_us": {"p50": 60.0, "p90": 61.0, "n": 2},
         "host_us": {"p50": 17.0, "p90": 18.0, "n": 100}, "gpu_us": {"p50": 60.0, "p90": 61.0, "n": 100},
         "peak_device_bytes": 8388608},
        {"strategy": "torch-recapture", "floor": "torch-graph-fixed", "dtype": "float32",
         "step_us": None, "batch_us": None, "host_us": None, "gpu_us": None, "peak_device_bytes": None,
         "error": "RuntimeError: fabricated capture failure"},
    ],
}

# --- TEST FIXTURE (fabricated): jax_peers.py output (no GPU time).
FIXTURE_JAX = {
    "system": "jax", "device": "FAKE GPU 0", "versions": {"jax": "0.0-fixture"}, "workload": "mlp",
    "dtype": "float32",
    "results": [
        {"strategy": "jax-cmdbuf-off-fixed", "floor": "jax-cmdbuf-off-fixed", "dtype": "float32",
         "step_us": {"p50": 100.0, "p90": 110.0}, "host_us": {"p50": 20.0, "p90": 22.0}, "gpu_us": None,
         "peak_device_bytes": 1048576},
        {"strategy": "jax-cmdbuf-off", "floor": "jax-cmdbuf-off-fixed", "dtype": "float32",
         "step_us": {"p50": 125.0, "p90": 130.0}, "host_us": {"p50": 21.0, "p90": 23.0}, "gpu_us": None,
         "peak_device_bytes": 2097152},
    ],
}


def write(dirpath, name, doc):
    os.makedirs(dirpath, exist_ok=True)
    path = os.path.join(dirpath, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    return path


def by_strategy(rows, system=None, dtype="float32"):
    return {r["strategy"]: r for r in rows if (system is None or r["system"] == system) and r["dtype"] == dtype}


class MergeTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def layout(self, sg=FIXTURE_SG, sg_fixed=FIXTURE_SG_FIXED, torch=FIXTURE_TORCH, jax=FIXTURE_JAX,
               workload="mlp"):
        d = os.path.join(self.root, workload)
        if sg is not None:
            write(d, "stablegraph.json", sg)
        if sg_fixed is not None:
            write(d, "stablegraph-fixed.json", sg_fixed)
        if torch is not None:
            write(d, "torch.json", torch)
        if jax is not None:
            write(d, "jax.json", jax)
        return d

    def test_peer_ratios_against_their_floor(self):
        self.layout()
        merged, _ = merge.merge([self.root])
        rows = by_strategy(merged["workloads"]["mlp"], "pytorch")
        self.assertAlmostEqual(rows["torch-graph-copy"]["ratio"], 66.0 / 55.0, places=4)
        self.assertAlmostEqual(rows["torch-graph-copy"]["gpu_ratio"], 60.0 / 48.0, places=4)
        self.assertEqual(rows["torch-graph-fixed"]["ratio"], 1.0)
        self.assertEqual(rows["torch-graph-copy"]["batch_us"], {"p50": 60.0, "p90": 61.0})
        jrows = by_strategy(merged["workloads"]["mlp"], "jax")
        self.assertAlmostEqual(jrows["jax-cmdbuf-off"]["ratio"], 1.25)
        self.assertIsNone(jrows["jax-cmdbuf-off"]["gpu_ratio"])
        self.assertIsNone(jrows["jax-cmdbuf-off"]["gpu_us"])

    def test_failed_peer_strategy_is_a_row_with_its_error(self):
        self.layout()
        merged, _ = merge.merge([self.root])
        r = by_strategy(merged["workloads"]["mlp"], "pytorch")["torch-recapture"]
        self.assertIn("fabricated capture failure", r["error"])
        self.assertIsNone(r["ratio"])
        self.assertIsNone(r["step_us"])

    def test_stablegraph_step_us_is_gpu_time_and_floor_is_fixed_run(self):
        self.layout()
        merged, problems = merge.merge([self.root])
        rows = by_strategy(merged["workloads"]["mlp"], "stablegraph")
        patch = rows["patch"]
        self.assertEqual(patch["gpu_us"], {"p50": 60.0, "p90": 66.0})
        self.assertIsNone(patch["step_us"])  # no wall_us in the bench JSON
        self.assertEqual(patch["floor"], "patch-fixed")
        self.assertAlmostEqual(patch["gpu_ratio"], 60.0 / 50.0)
        self.assertIsNone(patch["ratio"])
        self.assertEqual(rows["patch-fixed"]["gpu_ratio"], 1.0)
        # pool: zeros mean no samples; no fixed run of it: no floor, no ratio.
        self.assertIsNone(rows["pool"]["gpu_us"])
        self.assertIsNone(rows["pool"]["floor"])
        self.assertIn("fell back", rows["pool"]["note"])
        self.assertIsNone(rows["pool"]["peak_device_bytes"])

    def test_stablegraph_wall_us_used_when_present(self):
        sg = copy.deepcopy(FIXTURE_SG)
        sg["results"][1]["wall_us"] = {"p50": 70.0, "p90": 75.0}
        fixed = copy.deepcopy(FIXTURE_SG_FIXED)
        fixed["results"][1]["wall_us"] = {"p50": 56.0, "p90": 57.0}
        self.layout(sg=sg, sg_fixed=fixed)
        merged, _ = merge.merge([self.root])
        patch = by_strategy(merged["workloads"]["mlp"], "stablegraph")["patch"]
        self.assertEqual(patch["step_us"], {"p50": 70.0, "p90": 75.0})
        self.assertAlmostEqual(patch["ratio"], 70.0 / 56.0, places=4)

    def test_stablegraph_with_explicit_gpu_us(self):
        sg = copy.deepcopy(FIXTURE_SG)
        sg["results"][1]["gpu_us"] = {"p50": 40.0, "p90": 41.0}
        self.layout(sg=sg, sg_fixed=None)
        merged, _ = merge.merge([self.root])
        patch = by_strategy(merged["workloads"]["mlp"], "stablegraph")["patch"]
        self.assertEqual(patch["gpu_us"], {"p50": 40.0, "p90": 41.0})
        self.assertEqual(patch["step_us"], {"p50": 60.0, "p90": 66.0})

    def test_replay_fixed_row_is_the_floor_when_present(self):
        sg = copy.deepcopy(FIXTURE_SG)
        sg["results"].append({"strategy": "replay-fixed", "step_us": {"p50": 40.0, "p90": 41.0},
                              "host_us": {"p50": 2.0, "p90": 3.0}, "peak_device_bytes": 4194304})
        self.layout(sg=sg, sg_fixed=None)
        merged, problems = merge.merge([self.root])
        rows = by_strategy(merged["workloads"]["mlp"], "stablegraph")
        self.assertEqual(rows["patch"]["floor"], "replay-fixed")
        self.assertAlmostEqual(rows["patch"]["gpu_ratio"], 1.5)
        self.assertAlmostEqual(rows["eager"]["gpu_ratio"], 7.5)
        self.assertEqual(rows["replay-fixed"]["gpu_ratio"], 1.0)
        self.assertFalse(any("no stablegraph floor" in p for p in problems))

    def test_missing_floor_and_missing_stablegraph_are_reported(self):
        self.layout(sg=None, sg_fixed=None, workload="train")
        self.layout(sg_fixed=None, workload="mlp")
        merged, problems = merge.merge([self.root])
        self.assertIn("train", merged["workloads"])
        self.assertTrue(any(p.startswith("train: no stablegraph results") for p in problems), problems)
        self.assertTrue(any(p.startswith("mlp: no stablegraph floor") for p in problems), problems)

    def test_workload_from_directory_beats_json_field(self):
        sg = copy.deepcopy(FIXTURE_SG)
        sg["workload"] = "mlp (width 1024, batch 64)"  # fabricated descriptive name
        self.layout(sg=sg, sg_fixed=None, torch=None, jax=None, workload="mlp-large")
        merged, _ = merge.merge([self.root])
        self.assertEqual(list(merged["workloads"]), ["mlp-large"])

    def test_dp_directories_are_workloads(self):
        # scripts/gpu-multi's layout: one directory per scaling and rank count.
        with tempfile.TemporaryDirectory() as d:
            for sub in ("dp-weak-n2", "dp-strong-n4"):
                os.makedirs(os.path.join(d, sub))
                sg = copy.deepcopy(FIXTURE_SG)
                sg["workload"] = "dp (fabricated)"
                sg["results"].append({"strategy": "replay-fixed", "step_us": {"p50": 40.0, "p90": 41.0},
                                      "host_us": {"p50": 4.0, "p90": 5.0}, "outputs_match_eager": True})
                peer = copy.deepcopy(FIXTURE_TORCH)
                peer["workload"] = "dp"
                for name, doc in (("stablegraph.json", sg), ("torch.json", peer)):
                    with open(os.path.join(d, sub, name), "w") as f:
                        json.dump(doc, f)
            merged, problems = merge.merge([d])
            self.assertEqual(sorted(merged["workloads"]), ["dp-strong-n4", "dp-weak-n2"])
            systems = {r["system"] for r in merged["workloads"]["dp-weak-n2"]}
            self.assertEqual(systems, {"stablegraph", "pytorch"})

    def test_workload_from_json_field_for_loose_files(self):
        sg = copy.deepcopy(FIXTURE_SG)
        sg["workload"] = "chain (K=1000)"
        path = write(os.path.join(self.root, "loose"), "sg.json", sg)
        merged, _ = merge.merge([path])
        self.assertEqual(list(merged["workloads"]), ["chain"])
        merged, _ = merge.merge([path], workload_override="train")
        self.assertEqual(list(merged["workloads"]), ["train"])

    def test_bad_files_are_problems_not_crashes(self):
        d = self.layout()
        with open(os.path.join(d, "broken.json"), "w") as f:
            f.write("{not json")
        write(d, "other.json", {"hello": 1})
        write(d, "list.json", [1, 2])
        merged, problems = merge.merge([self.root])
        self.assertTrue(any("not valid JSON" in p for p in problems))
        self.assertTrue(any("neither a peer nor" in p for p in problems))
        self.assertTrue(any("not a JSON object" in p for p in problems))
        self.assertEqual(len(merged["workloads"]["mlp"]), 5 + 3 + 2)

    def test_whole_peer_failure_is_reported(self):
        torch_doc = {"system": "pytorch", "device": None, "workload": "mlp", "dtype": "float32",
                     "results": [], "error": "ModuleNotFoundError: No module named 'torch'"}
        self.layout(torch=torch_doc)
        merged, problems = merge.merge([self.root])
        self.assertTrue(any("pytorch could not run" in p and "torch" in p for p in problems), problems)

    def test_bf16_rows_are_separate(self):
        bf = copy.deepcopy(FIXTURE_TORCH)
        bf["dtype"] = "bfloat16"
        for r in bf["results"]:
            r["dtype"] = "bfloat16"
        bf["results"][1]["step_us"] = {"p50": 60.0, "p90": 61.0}
        d = self.layout()
        write(d, "torch-bf16.json", bf)
        merged, problems = merge.merge([self.root])
        self.assertFalse(any("appears twice" in p for p in problems), problems)
        f32 = by_strategy(merged["workloads"]["mlp"], "pytorch", "float32")
        b16 = by_strategy(merged["workloads"]["mlp"], "pytorch", "bfloat16")
        self.assertAlmostEqual(f32["torch-graph-copy"]["ratio"], 66.0 / 55.0, places=4)
        self.assertAlmostEqual(b16["torch-graph-copy"]["ratio"], 60.0 / 55.0, places=4)

    def test_sim_backend_is_flagged(self):
        sg = copy.deepcopy(FIXTURE_SG)
        sg["backend"] = "sim"
        self.layout(sg=sg)
        _, problems = merge.merge([self.root])
        self.assertTrue(any("backend 'sim'" in p for p in problems), problems)

    def test_row_order_and_fields(self):
        self.layout()
        merged, _ = merge.merge([self.root])
        rows = merged["workloads"]["mlp"]
        systems = [r["system"] for r in rows]
        self.assertEqual(systems, sorted(systems, key=lambda s: merge.SYSTEM_ORDER[s]))
        want = {"system", "strategy", "dtype", "step_us", "batch_us", "host_us", "gpu_us", "ratio",
                "gpu_ratio", "peak_device_bytes", "floor"}
        for r in rows:
            self.assertTrue(want <= set(r), r)
        json.dumps(merged, allow_nan=False)  # plain JSON

    def test_main_writes_merged_json_and_prints_tables(self):
        self.layout()
        self.layout(workload="chain")
        out = os.path.join(self.root, "merged.json")
        buf = io.StringIO()
        with redirect_stdout(buf):
            rc = merge.main(["--out", out, self.root])
        self.assertEqual(rc, 0)
        text = buf.getvalue()
        self.assertIn("== mlp ==", text)
        self.assertIn("== chain ==", text)
        self.assertLess(text.index("== mlp =="), text.index("== chain =="))
        self.assertIn("torch-graph-copy", text)
        self.assertIn("1.20x", text)  # 66 / 55
        self.assertIn("8.0 MiB", text)
        with open(out) as f:
            doc = json.load(f)
        self.assertEqual(set(doc["workloads"]), {"mlp", "chain"})
        # A second merge over the same directory ignores the merged file.
        with redirect_stdout(io.StringIO()):
            merge.main(["--out", out, self.root])
        with open(out) as f:
            again = json.load(f)
        self.assertEqual(len(again["workloads"]["mlp"]), len(doc["workloads"]["mlp"]))

    def test_nothing_found(self):
        buf = io.StringIO()
        with redirect_stdout(buf):
            rc = merge.main([self.root])
        self.assertEqual(rc, 1)
        self.assertIn("no JSON files", buf.getvalue())


class FormatTest(unittest.TestCase):
    def test_us(self):
        self.assertEqual(merge.fmt_us(None), "-")
        self.assertEqual(merge.fmt_us(5.256), "5.26")
        self.assertEqual(merge.fmt_us(65.51), "65.5")
        self.assertEqual(merge.fmt_us(1234.4), "1234")

    def test_bytes(self):
        self.assertEqual(merge.fmt_bytes(None), "-")
        self.assertEqual(merge.fmt_bytes(512), "512 B")
        self.assertEqual(merge.fmt_bytes(1536), "1.5 KiB")
        self.assertEqual(merge.fmt_bytes(3 << 30), "3.0 GiB")

    def test_pct_rejects_non_measurements(self):
        self.assertIsNone(merge.pct(None))
        self.assertIsNone(merge.pct({"p50": 0, "p90": 0}))
        self.assertIsNone(merge.pct({"p50": True}))
        self.assertEqual(merge.pct({"p50": 2, "p90": 3, "n": 9}), {"p50": 2.0, "p90": 3.0})


if __name__ == "__main__":
    unittest.main()
