"""Tests of common.py (the timing harness and helpers) and of the peers'
command lines on a machine without torch or jax (they must write a JSON
file that records the failure instead of crashing).

The fake steps and clocks below are test fixtures, not measurements.

Run: cd bench/peers && python3 -m unittest -v
"""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest
from types import SimpleNamespace

import common

HERE = os.path.dirname(os.path.abspath(__file__))


class PercentileTest(unittest.TestCase):
    def test_linear_between_closest_ranks(self):
        # The same rule as report.Percentile (numpy's default).
        self.assertIsNone(common.percentile([], 50))
        self.assertEqual(common.percentile([7], 90), 7)
        self.assertEqual(common.percentile([1, 2, 3, 4], 50), 2.5)
        self.assertAlmostEqual(common.percentile(list(range(1, 11)), 90), 9.1)
        self.assertEqual(common.percentile([3, 1, 2], 0), 1)
        self.assertEqual(common.percentile([3, 1, 2], 100), 3)
        self.assertEqual(common.percentile([3, 1, 2], 250), 3)

    def test_summarize(self):
        self.assertIsNone(common.summarize([]))
        self.assertEqual(common.summarize([1.0, 2.0, 3.0]), {"p50": 2.0, "p90": 2.8, "n": 3})


class FakeClock:
    """A nanosecond clock that the fake step and sync advance."""

    def __init__(self):
        self.t = 0

    def __call__(self):
        return self.t


class FakeGPU:
    def __init__(self, clock):
        self.clock = clock
        self.begins, self.ends, self.waits = {}, {}, []

    def begin(self, j):
        self.begins[j] = self.clock.t

    def end(self, j):
        self.ends[j] = self.clock.t

    def wait(self, j):
        self.waits.append(j)
        self.clock.t += 3000  # the sync: 3 us

    def elapsed_us(self, n):
        return [(self.ends[j] - self.begins[j]) / 1e3 + 40.0 for j in range(n)]


class MeasureTest(unittest.TestCase):
    def run_measure(self, gpu=True, **kw):
        clock = FakeClock()
        calls, syncs = [], []

        def step(i):
            calls.append(i)
            clock.t += 10000  # the issuing call: 10 us

        def sync():
            syncs.append(len(calls))
            clock.t += 3000

        g = FakeGPU(clock) if gpu else None
        args = dict(steps=20, warmup=5, batch=10)
        args.update(kw)
        m = common.measure(step, sync, gpu=g, clock=clock, **args)
        return m, calls, syncs, g

    def test_phases_and_indices(self):
        m, calls, syncs, g = self.run_measure()
        self.assertEqual(calls, list(range(5 + 20 + 20)))  # the index keeps counting: the ring turns
        self.assertEqual(len(m.step), 20)
        self.assertEqual(m.host, [10.0] * 20)
        self.assertEqual(m.step, [13.0] * 20)  # call + the event wait
        self.assertEqual(m.gpu, [50.0] * 20)
        self.assertEqual(g.waits, list(range(20)))
        # Batches: two of 10 steps, one sync before and one after each.
        self.assertEqual(len(m.batch), 2)
        self.assertAlmostEqual(m.batch[0], (10 * 10 + 3) / 10)
        self.assertEqual(syncs, [5, 25, 35, 35, 45])

    def test_without_gpu_the_sync_ends_each_step(self):
        m, calls, syncs, _ = self.run_measure(gpu=False, steps=4, warmup=0, batch=100)
        self.assertEqual(m.gpu, [])
        self.assertEqual(m.step, [13.0] * 4)
        self.assertEqual(len(m.batch), 1)  # batch clipped to steps
        fields = m.fields(with_samples=False)
        self.assertIsNone(fields["gpu_us"])
        self.assertEqual(fields["host_us"]["p50"], 10.0)
        self.assertNotIn("step_samples_us", fields)
        self.assertIn("step_samples_us", m.fields(with_samples=True))

    def test_time_limit_cuts_phases_with_a_note(self):
        # 13 us per step; 0.0001 s total means 50 us per phase.
        m, calls, _, _ = self.run_measure(steps=100, warmup=0, batch=2, max_seconds=0.0001)
        self.assertLess(len(m.step), 100)
        self.assertLess(len(m.batch), 50)
        self.assertEqual(len(m.gpu), len(m.step))
        self.assertTrue(any("per-step phase stopped" in n for n in m.notes))
        self.assertTrue(any("batch phase stopped" in n for n in m.notes))

    def test_align_before_each_step_and_batch_outside_the_clock(self):
        events = []
        clock = FakeClock()

        def align():
            events.append(("align", clock.t))
            clock.t += 1_000_000  # a slow barrier: 1 ms, which no time may include

        def step(i):
            events.append(("step", i))
            clock.t += 10000

        m = common.measure(step, lambda: None, steps=4, warmup=1, batch=2, gpu=FakeGPU(clock), clock=clock,
                           align=align)
        kinds = [e[0] for e in events]
        # warm-up step 0; per step: align, step (4); per batch: align, 2 steps (2 batches).
        self.assertEqual(kinds, ["step"] + ["align", "step"] * 4 + ["align", "step", "step"] * 2)
        self.assertEqual(m.host, [10.0] * 4)
        self.assertEqual(m.step, [13.0] * 4)
        self.assertEqual(m.batch, [10.0, 10.0])

    def test_bad_steps(self):
        with self.assertRaises(ValueError):
            common.measure(lambda i: None, lambda: None, steps=0, warmup=0, batch=1)


class HelpersTest(unittest.TestCase):
    def test_select_strategies_brings_floors_in_order(self):
        floors = {"a": "f", "f": "f", "b": "f"}
        order = ["f", "a", "b"]
        self.assertEqual(common.select_strategies("b", floors, order, "sys"), ["f", "b"])
        self.assertEqual(common.select_strategies("all", floors, order, "sys"), order)
        self.assertEqual(common.select_strategies("sys", floors, order, "sys"), order)
        with self.assertRaises(ValueError):
            common.select_strategies("nope", floors, order, "sys")
        with self.assertRaises(ValueError):
            common.select_strategies(" , ", floors, order, "sys")

    def test_workload_spec(self):
        self.assertEqual(common.workload_spec("mlp-large")["width"], 1024)
        self.assertEqual(common.workload_spec("chain", 10)["k"], 10)
        self.assertEqual(common.workload_spec("chain")["k"], 1000)
        with self.assertRaises(ValueError):
            common.workload_spec("chain", 1)
        with self.assertRaises(ValueError):
            common.workload_spec("nope")

    def test_write_json_replaces_nan(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "sub", "x.json")
            common.write_json(path, {"a": float("nan"), "b": [1.0, float("inf")]})
            with open(path) as f:
                self.assertEqual(json.load(f), {"a": None, "b": [1.0, None]})

    def test_failed_result(self):
        try:
            raise RuntimeError("boom\nsecond line")
        except RuntimeError as e:
            r = common.failed_result("s", "f", e, dtype="float32")
        self.assertEqual(r["error"], "RuntimeError: boom ...")
        self.assertIsNone(r["step_us"])
        self.assertEqual(r["dtype"], "float32")
        self.assertTrue(r["traceback"])

    def test_base_doc_field_names(self):
        args = SimpleNamespace(dtype="float32", steps=10, warmup=1, batch=5, ring=2)
        doc = common.base_doc("pytorch", args, common.workload_spec("train"))
        self.assertEqual(doc["workload"], "train")
        self.assertEqual(doc["shape"]["lr"], 0.01)
        self.assertEqual(doc["results"], [])


def have(mod):
    return importlib.util.find_spec(mod) is not None


class CLIWithoutFrameworksTest(unittest.TestCase):
    """Where torch / jax are missing, the peers still write their JSON."""

    def run_peer(self, script, extra=()):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "out.json")
            p = subprocess.run([sys.executable, os.path.join(HERE, script), "--workload", "mlp",
                                "--steps", "3", "--warmup", "1", "--json", out, *extra],
                               capture_output=True, text=True, timeout=120)
            with open(out) as f:
                return p, json.load(f)

    @unittest.skipIf(have("torch"), "torch is installed here")
    def test_torch_peers_records_missing_torch(self):
        p, doc = self.run_peer("torch_peers.py")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertEqual(doc["system"], "pytorch")
        self.assertIn("torch", doc["error"])
        self.assertEqual(doc["results"], [])

    @unittest.skipIf(have("jax"), "jax is installed here")
    def test_jax_peers_records_failed_children(self):
        p, doc = self.run_peer("jax_peers.py", ["--system", "jax-cmdbuf-on"])
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertEqual(doc["system"], "jax")
        names = [r["strategy"] for r in doc["results"]]
        self.assertEqual(names, ["jax-cmdbuf-on-fixed", "jax-cmdbuf-on"])
        for r in doc["results"]:
            self.assertIn("No module named", r["error"])
            self.assertEqual(r["floor"], "jax-cmdbuf-on-fixed")
        self.assertIn("mode on", p.stderr)

    def test_bad_flags_are_usage_errors(self):
        for script in ("torch_peers.py", "jax_peers.py"):
            p = subprocess.run([sys.executable, os.path.join(HERE, script), "--workload", "mlp",
                                "--system", "nope"], capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 2)
            self.assertIn("unknown strategy", p.stderr)


class XlaFlagsTest(unittest.TestCase):
    def test_flags(self):
        spec = importlib.util.spec_from_file_location("jax_peers", os.path.join(HERE, "jax_peers.py"))
        jp = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(jp)
        self.assertEqual(jp.xla_flags_for("off", ""), "--xla_gpu_enable_command_buffer=")
        self.assertEqual(jp.xla_flags_for("on", "--a=1 --xla_gpu_enable_command_buffer=FUSION"), "--a=1")
        self.assertEqual(jp.xla_flags_for("off", "--xla_gpu_enable_command_buffer=FUSION --b"),
                         "--b --xla_gpu_enable_command_buffer=")


if __name__ == "__main__":
    unittest.main()
