"""Shared pieces of the peer benchmarks (torch_peers.py, jax_peers.py).

The workloads are those of docs/WORKLOADS.md; this module holds their shapes,
the input data (numpy, fixed seed), a float64 numpy reference of the stateless
steps, the timing harness and the JSON writer. It imports only the standard
library at import time (numpy is imported by the data helpers), so that the
timing harness can be unit-tested on a machine without numpy, torch or jax.

Timing (the same for every peer; see bench/README.md):

  step_us   wall time of one step, host clock, from just before the step is
            issued until the host has seen it finish (the system's own sync:
            a CUDA event synchronize for PyTorch, block_until_ready for JAX).
            Percentiles over the measured steps.
  batch_us  wall time per step of back-to-back steps with one sync at the end
            of each batch of --batch steps, divided by the batch size
            (throughput; per-step sync inflates step_us). Percentiles over
            the batches.
  host_us   host time of the call that issues the step (it returns before the
            GPU is done). Percentiles over the measured steps.
  gpu_us    GPU time between CUDA events recorded just before and just after
            the step on the stream it runs on (PyTorch only; null for JAX).
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
import traceback

# Workload shapes, from docs/WORKLOADS.md.
WORKLOADS = {
    "mlp": {"kind": "mlp", "layers": 8, "width": 256, "batch": 8},
    "mlp-large": {"kind": "mlp", "layers": 8, "width": 1024, "batch": 64},
    "train": {"kind": "train", "layers": 8, "width": 256, "batch": 8, "lr": 0.01},
    "chain": {"kind": "chain", "k": 1000, "n": 256, "a": 0.999, "b": 0.001},
}

DTYPES = ("float32", "bfloat16")

# Absolute error of a step's output against the float64 numpy reference
# above which the output is reported as wrong.
TOLERANCE = {"float32": 1e-3, "bfloat16": 1e-1}


def workload_spec(name: str, chain_k: int | None = None) -> dict:
    """The shape of workload name (a copy), with chain's K overridden."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    spec = dict(WORKLOADS[name])
    spec["name"] = name
    if spec["kind"] == "chain" and chain_k is not None:
        if chain_k < 2:
            raise ValueError(f"--chain-k {chain_k}: the chain needs at least 2 kernels")
        spec["k"] = chain_k
    return spec


def stateless(spec: dict) -> bool:
    """Whether a step's output depends only on its input (not on state
    updated by earlier steps), so that it can be checked against numpy."""
    return spec["kind"] in ("mlp", "chain")


# ---------------------------------------------------------------- logging


def log(tag: str, msg: str) -> None:
    """A progress line on stderr, flushed at once."""
    print(f"[{time.strftime('%H:%M:%S')} {tag}] {msg}", file=sys.stderr, flush=True)


def describe_exception(exc: BaseException) -> str:
    """One line: the exception type and message."""
    msg = str(exc).strip().splitlines()
    first = msg[0] if msg else ""
    if len(msg) > 1:
        first += " ..."
    return f"{type(exc).__name__}: {first}"[:600]


def traceback_tail(exc: BaseException, lines: int = 12) -> list[str]:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    out = "".join(tb).rstrip().splitlines()
    return out[-lines:]


# ---------------------------------------------------------------- data


def make_data(spec: dict, ring: int, seed: int) -> dict:
    """Host data (float32 numpy arrays) for spec: the state and `ring`
    distinct inputs (and targets for train).

    Weights and biases are uniform in [-1/sqrt(width), 1/sqrt(width)],
    inputs and targets uniform in [-1, 1], from numpy's default_rng(seed).
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    f32 = np.float32
    d: dict = {}
    if spec["kind"] in ("mlp", "train"):
        w, bt, L = spec["width"], spec["batch"], spec["layers"]
        lim = 1.0 / math.sqrt(w)
        d["W"] = [rng.uniform(-lim, lim, (w, w)).astype(f32) for _ in range(L)]
        d["b"] = [rng.uniform(-lim, lim, (w,)).astype(f32) for _ in range(L)]
        d["xs"] = [rng.uniform(-1, 1, (bt, w)).astype(f32) for _ in range(ring)]
        if spec["kind"] == "train":
            d["ts"] = [rng.uniform(-1, 1, (bt, w)).astype(f32) for _ in range(ring)]
    elif spec["kind"] == "chain":
        d["xs"] = [rng.uniform(-1, 1, (spec["n"],)).astype(f32) for _ in range(ring)]
    else:
        raise ValueError(f"unknown workload kind {spec['kind']!r}")
    return d


def reference_output(spec: dict, data: dict, x, round_to=None):
    """The step's output for input x, in float64 numpy (stateless workloads
    only). round_to, when given, is applied to the weights first (so that a
    bfloat16 run is compared with the weights it actually used)."""
    import numpy as np

    r = round_to or (lambda a: a)
    h = np.asarray(r(x), dtype=np.float64)
    if spec["kind"] == "mlp":
        for W, b in zip(data["W"], data["b"]):
            h = np.tanh(h @ np.asarray(r(W), np.float64) + np.asarray(r(b), np.float64))
        return h
    if spec["kind"] == "chain":
        a, b = spec["a"], spec["b"]
        for _ in range(spec["k"]):
            h = a * h + b
        return h
    raise ValueError(f"workload {spec['name']} is not stateless")


# ---------------------------------------------------------------- statistics


def percentile(samples, p: float) -> float | None:
    """The p-th percentile by linear interpolation between closest ranks
    (numpy's default, the same rule as stablegraph's report.Percentile).
    None for no samples."""
    s = sorted(samples)
    if not s:
        return None
    p = max(0.0, min(100.0, p))
    h = (len(s) - 1) * p / 100.0
    lo = math.floor(h)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (h - lo) * (s[hi] - s[lo])


def summarize(samples) -> dict | None:
    """{"p50", "p90", "n"} of samples in microseconds, or None if empty."""
    if not samples:
        return None
    return {
        "p50": round(percentile(samples, 50), 3),
        "p90": round(percentile(samples, 90), 3),
        "n": len(samples),
    }


# ---------------------------------------------------------------- harness


class Measurement:
    """Samples of one strategy, microseconds."""

    def __init__(self) -> None:
        self.step: list[float] = []  # wall per step, synced each step
        self.host: list[float] = []  # host time of the issuing call
        self.gpu: list[float] = []  # GPU time by events (when available)
        self.batch: list[float] = []  # wall per step over batches
        self.notes: list[str] = []

    def fields(self, with_samples: bool) -> dict:
        out = {
            "step_us": summarize(self.step),
            "batch_us": summarize(self.batch),
            "host_us": summarize(self.host),
            "gpu_us": summarize(self.gpu),
            "measured_steps": len(self.step),
        }
        if with_samples:
            out["step_samples_us"] = [round(v, 3) for v in self.step]
            out["host_samples_us"] = [round(v, 3) for v in self.host]
            if self.gpu:
                out["gpu_samples_us"] = [round(v, 3) for v in self.gpu]
            out["batch_samples_us"] = [round(v, 3) for v in self.batch]
        return out


def measure(step, sync, *, steps: int, warmup: int, batch: int, gpu=None,
            max_seconds: float | None = None, tag: str = "", clock=time.perf_counter_ns,
            align=None) -> Measurement:
    """Time step(i) (i = 0, 1, 2, ...: the step index, which picks the
    input) in three phases:

    1. warm-up: `warmup` steps, then sync();
    2. per-step: `steps` steps, each timed on the host clock around the
       issuing call (host) and until the system's sync returns (step); with
       gpu, events recorded just before and just after the step (gpu.begin(j),
       gpu.end(j)) and gpu.wait(j) as the sync, read after the phase by
       gpu.elapsed_us(n);
    3. batch: the same number of steps again in batches of `batch`, one
       sync() per batch, wall / batch size per batch.

    max_seconds bounds phases 2 and 3 together (each gets half); a phase cut
    short leaves a note. The index keeps counting across phases so that the
    input ring keeps turning.

    align, when given (several ranks), is called before each step of phase
    2 and before each batch of phase 3, after the sync and outside the
    clock: a barrier that returns when every rank has reached it, so that
    the ranks' timed work starts together (torch_dp.py).
    """
    if steps <= 0:
        raise ValueError(f"steps must be positive, not {steps}")
    m = Measurement()
    i = 0
    for _ in range(max(0, warmup)):
        step(i)
        i += 1
    sync()

    phase_ns = None if not max_seconds else max_seconds * 0.5e9
    start = clock()
    for j in range(steps):
        if align is not None:
            align()
        if gpu is not None:
            gpu.begin(j)
        t0 = clock()
        step(i)
        t1 = clock()
        if gpu is not None:
            gpu.end(j)
            gpu.wait(j)
        else:
            sync()
        t2 = clock()
        i += 1
        m.host.append((t1 - t0) / 1e3)
        m.step.append((t2 - t0) / 1e3)
        if phase_ns is not None and t2 - start > phase_ns and j + 1 < steps:
            m.notes.append(f"per-step phase stopped after {j + 1} of {steps} steps (time limit)")
            break
    if gpu is not None:
        m.gpu = list(gpu.elapsed_us(len(m.step)))

    per = max(1, min(batch, steps))
    batches = max(1, steps // per)
    start = clock()
    for k in range(batches):
        sync()
        if align is not None:
            align()
        t0 = clock()
        for _ in range(per):
            step(i)
            i += 1
        sync()
        t1 = clock()
        m.batch.append((t1 - t0) / 1e3 / per)
        if phase_ns is not None and t1 - start > phase_ns and k + 1 < batches:
            m.notes.append(f"batch phase stopped after {k + 1} of {batches} batches (time limit)")
            break
    if tag:
        s, b = summarize(m.step), summarize(m.batch)
        log(tag, f"step p50 {s['p50']:.1f} us, batch p50 {b['p50']:.1f} us/step")
    return m


class TorchEvents:
    """CUDA events around each measured step, on the current stream: the
    gpu argument of measure for the PyTorch peers (torch passed in, so that
    this module imports without it)."""

    def __init__(self, torch, n):
        self.s = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        self.e = [torch.cuda.Event(enable_timing=True) for _ in range(n)]

    def begin(self, j):
        self.s[j].record()

    def end(self, j):
        self.e[j].record()

    def wait(self, j):
        self.e[j].synchronize()

    def elapsed_us(self, n):
        return [self.s[j].elapsed_time(self.e[j]) * 1000.0 for j in range(n)]


# ---------------------------------------------------------------- results


def finish_result(res: dict, notes: list, err: float | None, dtype: str) -> None:
    """Record in res the output check, err being the largest difference
    from the numpy reference (None: no reference, nothing checked), and the
    notes, the check's own among them."""
    if err is None:
        res["max_abs_err"] = None
        res["output_ok"] = None
    else:
        res["max_abs_err"] = err
        res["output_ok"] = err <= TOLERANCE[dtype]
        if not res["output_ok"]:
            notes.append(f"output differs from the numpy reference by {err:.3g}")
    if notes:
        res["note"] = "; ".join(notes)


def finish_run(tag: str, path: str, doc: dict, failures: int, msg: str) -> int:
    """End a run: log msg, print doc on stdout where no path was given (it
    is written there already otherwise), and return the exit status (1
    when any strategy failed)."""
    log(tag, msg)
    if not path:
        json.dump(doc, sys.stdout, indent=2)
        print()
    return 1 if failures else 0


def cannot_run(tag: str, path: str, doc: dict, exc: BaseException) -> int:
    """Record in doc, log and write to path why the system cannot run at
    all (exc, raised setting it up), and return the exit status that says
    so."""
    doc["error"] = describe_exception(exc)
    doc["traceback"] = traceback_tail(exc)
    log(tag, f"cannot run: {doc['error']}")
    write_json(path, doc)
    return 2


def _no_numbers(strategy: str, floor: str, error: str) -> dict:
    """A result entry without measurements: strategy, floor and why."""
    return {
        "strategy": strategy,
        "floor": floor,
        "step_us": None,
        "batch_us": None,
        "host_us": None,
        "gpu_us": None,
        "peak_device_bytes": None,
        "error": error,
    }


def failed_result(strategy: str, floor: str, exc: BaseException, **extra) -> dict:
    """The result entry of a strategy that failed: the error instead of
    numbers, so that the rest of the run survives."""
    r = _no_numbers(strategy, floor, describe_exception(exc))
    r["traceback"] = traceback_tail(exc)
    r.update(extra)
    return r


def skipped_result(strategy: str, floor: str, why: str, **extra) -> dict:
    r = _no_numbers(strategy, floor, f"skipped: {why}")
    r.update(extra)
    return r


def _clean(v):
    """v with NaN and infinities replaced by None (JSON has neither)."""
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def write_json(path: str, doc: dict) -> None:
    """Write doc to path atomically (a temporary file renamed over it), so
    that a run killed mid-write leaves the previous complete file."""
    if not path:
        return
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(_clean(doc), f, indent=2, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)


def base_doc(system: str, args, spec: dict) -> dict:
    """The top of a peer JSON file, before the system fills in device,
    versions and results."""
    return {
        "system": system,
        "device": None,
        "versions": {"python": platform.python_version()},
        "workload": spec["name"],
        "shape": {k: v for k, v in spec.items() if k != "name"},
        "dtype": args.dtype,
        "steps": args.steps,
        "warmup": args.warmup,
        "batch": args.batch,
        "ring": args.ring,
        "movement": f"ring of {args.ring} pre-allocated input (and output) buffers, "
                    "step i uses slot i mod ring; *-fixed strategies use one buffer",
        "timing": {
            "step_us": "wall per step, host clock, sync each step",
            "batch_us": "wall per step over batches of back-to-back steps, one sync per batch",
            "host_us": "host time of the call that issues the step",
            "gpu_us": "CUDA events around the step (null where not measured)",
            "percentiles": "linear interpolation between closest ranks (numpy default)",
        },
        "results": [],
    }


def add_common_args(p, strategies) -> None:
    """The command-line flags both peers share."""
    p.add_argument("--workload", required=True, choices=sorted(WORKLOADS),
                   help="workload of docs/WORKLOADS.md")
    p.add_argument("--system", default="all",
                   help="comma-separated strategies, or 'all' (%s); a strategy brings its floor along"
                   % ", ".join(strategies))
    p.add_argument("--steps", type=int, default=1000, help="measured steps per phase (default 1000)")
    p.add_argument("--warmup", type=int, default=50, help="warm-up steps (default 50)")
    p.add_argument("--batch", type=int, default=50,
                   help="steps per batch in the throughput phase (default 50)")
    p.add_argument("--ring", type=int, default=2,
                   help="input/output buffers the moving strategies rotate through (default 2: pingpong)")
    p.add_argument("--dtype", default="float32", choices=DTYPES, help="element type (default float32)")
    p.add_argument("--chain-k", type=int, default=None, help="kernels in the chain workload (default 1000)")
    p.add_argument("--seed", type=int, default=1, help="seed of the input data (default 1)")
    p.add_argument("--json", default="", metavar="FILE", help="write the results to FILE")
    p.add_argument("--samples", action="store_true", help="include per-step samples in the JSON")
    p.add_argument("--time-limit", type=float, default=0,
                   help="seconds for the whole run; strategies not started by then are skipped (0: none)")
    p.add_argument("--max-strategy-s", type=float, default=60,
                   help="cap on the measured phases of one strategy, seconds (default 60)")


def select_strategies(arg: str, floors: dict, order: list, system_alias: str) -> list:
    """The strategies named by --system, each with its floor, in run order
    (floors first). Raises ValueError naming unknown strategies."""
    want = set()
    for name in (s.strip() for s in arg.split(",")):
        if not name:
            continue
        if name in ("all", system_alias):
            want.update(order)
        elif name in floors:
            want.add(name)
            want.add(floors[name])
        else:
            raise ValueError(f"unknown strategy {name!r}; known: {', '.join(order)}, all")
    if not want:
        raise ValueError("--system selects no strategy")
    return [s for s in order if s in want]


def check_args(args) -> None:
    for name in ("steps", "batch", "ring"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name} must be positive")
    if args.warmup < 0:
        raise ValueError("--warmup must not be negative")
