#!/usr/bin/env python3
"""JAX peers of stablegraph's workloads (docs/WORKLOADS.md).

Strategies (the floor of each moving strategy is the same jitted function
called on the same input buffer, in the same XLA configuration):

  jax-cmdbuf-off        jax.jit with XLA command buffers (CUDA graphs) off:
                        XLA_FLAGS=--xla_gpu_enable_command_buffer= ; the input
                        is at a new address every step.
  jax-cmdbuf-off-fixed  its floor: the same call on one input buffer.
  jax-cmdbuf-on         jax.jit with XLA's default command buffers; the input
                        is at a new address every step (XLA must update or
                        re-record its command buffers).
  jax-cmdbuf-on-fixed   its floor.

XLA reads XLA_FLAGS once per process, so each setting runs in its own child
process (this script, re-run with --_child). The parent sets
XLA_PYTHON_CLIENT_PREALLOCATE=false so that the device memory column shows
what the step holds rather than 75% of the GPU, and merges the children's
results into one JSON file. Within a child the floor runs first: JAX's
peak_bytes_in_use cannot be reset, so the floor's peak is its own and the
moving strategy's peak (which holds more buffers) is the larger of the two.
Both include XLA's compile-time scratch (autotuning).

Inputs at a new address every step: a ring of --ring (default 2) device
arrays made before timing; step i reads slot i mod ring. Outputs: XLA
allocates each step's output; the caller keeps the last ring outputs (the
floor drops the previous output before the call, so that the allocator can
hand the same address back). train donates its state (donate_argnums), so
the weights are updated in place as in stablegraph.

GPU time: JAX offers no CUDA events on its stream from Python, so gpu_us is
null; step_us is the host wall time of the call plus block_until_ready.

float32 matmuls run in full float32 (jax_default_matmul_precision=highest: no
TF32). The chain puts lax.optimization_barrier after each axpb so that XLA
launches K kernels as the workload defines, instead of fusing the chain into
one kernel (--jax-chain-fuse lets it fuse).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

FLOORS = {
    "jax-cmdbuf-off": "jax-cmdbuf-off-fixed",
    "jax-cmdbuf-off-fixed": "jax-cmdbuf-off-fixed",
    "jax-cmdbuf-on": "jax-cmdbuf-on-fixed",
    "jax-cmdbuf-on-fixed": "jax-cmdbuf-on-fixed",
}
ORDER = ["jax-cmdbuf-off-fixed", "jax-cmdbuf-off", "jax-cmdbuf-on-fixed", "jax-cmdbuf-on"]
MODES = {
    "off": ["jax-cmdbuf-off-fixed", "jax-cmdbuf-off"],
    "on": ["jax-cmdbuf-on-fixed", "jax-cmdbuf-on"],
}
CMDBUF_FLAG = "--xla_gpu_enable_command_buffer"

TAG = "jax"


def xla_flags_for(mode: str, current: str) -> str:
    """XLA_FLAGS for a child: the caller's flags without any command-buffer
    setting, plus an empty command-buffer list when mode is "off"."""
    flags = [f for f in current.split() if not f.startswith(CMDBUF_FLAG)]
    if mode == "off":
        flags.append(CMDBUF_FLAG + "=")
    return " ".join(flags)


# ---------------------------------------------------------------- parent


def run_child(mode: str, strategies: list, args, argv: list, timeout: float) -> dict:
    """Run this script as a child for one XLA setting; return its JSON doc
    (with "error" set when the child failed or timed out)."""
    fd, out_path = tempfile.mkstemp(prefix=f"jax-peers-{mode}-", suffix=".json")
    os.close(fd)
    env = dict(os.environ)
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    env["PYTHONUNBUFFERED"] = "1"
    flags = xla_flags_for(mode, env.get("XLA_FLAGS", ""))
    if flags:
        env["XLA_FLAGS"] = flags
    else:
        env.pop("XLA_FLAGS", None)
    cmd = [sys.executable, os.path.abspath(__file__), *argv,
           "--_child", mode, "--_child-out", out_path, "--_strategies", ",".join(strategies)]
    common.log(TAG, f"mode {mode}: XLA_FLAGS={flags!r}; child timeout {timeout:.0f} s")
    tail = collections.deque(maxlen=25)
    err = None
    try:
        # The child stays in our process group, so that a timeout around this
        # whole script (bench/compare's) ends it too.
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, errors="replace")

        def pump():
            for line in proc.stderr:
                sys.stderr.write(line)
                sys.stderr.flush()
                tail.append(line.rstrip("\n"))
        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            rc = None
            err = f"child for mode {mode} timed out after {timeout:.0f} s"
        reader.join(timeout=5)
        if rc not in (None, 0) and err is None:
            err = f"child for mode {mode} exited with status {rc}"
    except OSError as e:
        err = f"cannot start child for mode {mode}: {e}"
    doc = {}
    try:
        with open(out_path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        doc = {}
    finally:
        try:
            os.unlink(out_path)
        except OSError:
            pass
    if err is not None:
        doc.setdefault("error", err)
        doc["child_error"] = err
        doc["stderr_tail"] = list(tail)
    doc["xla_flags"] = flags
    return doc


def parent_main(args, argv: list, spec: dict, names: list) -> int:
    deadline = time.monotonic() + args.time_limit if args.time_limit > 0 else None
    doc = common.base_doc("jax", args, spec)
    doc["timing"]["gpu_us"] = "null: no CUDA events on JAX's stream from Python; step_us is wall with block_until_ready"
    doc["env"] = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    common.write_json(args.json, doc)
    failures = 0
    for mode in ("off", "on"):
        strategies = [n for n in MODES[mode] if n in names]
        if not strategies:
            continue
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining < 5:
            for n in strategies:
                doc["results"].append(common.skipped_result(n, FLOORS[n], "time limit reached", dtype=args.dtype))
                failures += 1
            common.write_json(args.json, doc)
            continue
        timeout = args.mode_timeout if remaining is None else min(args.mode_timeout, remaining)
        child = run_child(mode, strategies, args, argv, timeout)
        if child.get("device") and not doc["device"]:
            doc["device"] = child["device"]
        for k, v in (child.get("versions") or {}).items():
            doc["versions"].setdefault(k, v)
        doc["versions"][f"xla_flags_{mode}"] = child.get("xla_flags", "")
        got = {r.get("strategy"): r for r in child.get("results", []) if isinstance(r, dict)}
        for n in strategies:
            r = got.get(n)
            if r is None:
                why = child.get("error") or "the child produced no result"
                r = common.skipped_result(n, FLOORS[n], why, dtype=args.dtype)
                r["error"] = why
                if child.get("traceback"):
                    r["traceback"] = child["traceback"]
                if child.get("stderr_tail"):
                    r["stderr_tail"] = child["stderr_tail"]
            r["xla_flags"] = child.get("xla_flags", "")
            if "error" in r:
                failures += 1
            doc["results"].append(r)
        if child.get("error") and not got:
            common.log(TAG, f"mode {mode} failed: {child['error']}")
        common.write_json(args.json, doc)
    return common.finish_run(TAG, args.json, doc, failures,
                             f"done: {len(names) - failures} of {len(names)} strategies measured"
                             + (f"; wrote {args.json}" if args.json else ""))


# ---------------------------------------------------------------- child


def build_functions(jax, jnp, spec: dict, fuse_chain: bool):
    """The step of spec as a Python function for jax.jit, and the jit
    options."""
    kind = spec["kind"]
    if kind == "mlp":
        def mlp(params, x):
            h = x
            for W, b in params:
                h = jnp.tanh(h @ W + b)
            return h
        return mlp, {}
    if kind == "train":
        bt, w, lr = spec["batch"], spec["width"], spec["lr"]

        def train(params, x, t):
            hs = [x]
            h = x
            for W, b in params:
                h = jnp.tanh(h @ W + b)
                hs.append(h)
            y = h
            dh = (2.0 / (bt * w)) * (y - t)
            new = list(params)
            for layer in range(len(params) - 1, -1, -1):
                W, b = params[layer]
                hl = hs[layer + 1]
                dz = dh * (1 - hl * hl)
                dW = hs[layer].T @ dz
                db = jnp.sum(dz, axis=0)
                if layer > 0:
                    dh = dz @ W.T  # from W before its update
                new[layer] = (W - lr * dW, b - lr * db)
            return tuple(new), y
        return train, {"donate_argnums": (0,)}
    if kind == "chain":
        a, b, k = spec["a"], spec["b"], spec["k"]
        barrier = (lambda v: v) if fuse_chain else jax.lax.optimization_barrier

        def chain(x):
            t = barrier(a * x + b)
            for _ in range(k - 2):
                t = barrier(a * t + b)
            return a * t + b
        return chain, {}
    raise ValueError(f"unknown workload kind {kind}")


_JITTED: dict = {}


def run_jax_strategy(name, jax, jnp, np, spec, data, args, ref):
    fixed = name.endswith("-fixed")
    tag = f"{TAG} {spec['name']} {name}"
    dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[args.dtype]
    dev = jax.devices()[0]
    R = args.ring
    kind = spec["kind"]

    def put(a):
        return jnp.asarray(a, dtype=dtype)  # a new device buffer each call

    t_setup = time.perf_counter()
    # One jitted function per child: the floor compiles it, the moving
    # strategy reuses the executable (and its command buffers).
    if "jitted" not in _JITTED:
        fn, opts = build_functions(jax, jnp, spec, args.jax_chain_fuse)
        _JITTED["jitted"] = jax.jit(fn, **opts)
    jitted = _JITTED["jitted"]
    st = {"params": None, "last": None}
    if kind in ("mlp", "train"):
        st["params"] = tuple((put(W), put(b)) for W, b in zip(data["W"], data["b"]))
    xs = [put(x) for x in data["xs"][:R]]
    ts = [put(t) for t in data["ts"][:R]] if kind == "train" else [None] * R
    x_fixed = put(data["xs"][0])
    t_fixed = put(data["ts"][0]) if kind == "train" else None
    outs = [None] * R

    def call(x, t):
        if kind == "mlp":
            return jitted(st["params"], x)
        if kind == "train":
            p, y = jitted(st["params"], x, t)
            st["params"] = p
            return y
        return jitted(x)

    if fixed:
        def step(i):
            st["last"] = None  # free the previous output first: same address back
            st["last"] = call(x_fixed, t_fixed)
        inputs = [x_fixed]
    else:
        def step(i):
            r = i % R
            y = call(xs[r], ts[r])
            outs[r] = y  # the caller keeps the last R outputs
            st["last"] = y

    def sync():
        if st["last"] is not None:
            st["last"].block_until_ready()

    if not fixed:
        inputs = xs
    jax.block_until_ready([xs, x_fixed, st["params"]])
    step(0)  # compiles
    sync()
    setup_s = time.perf_counter() - t_setup
    common.log(tag, f"first step (compiles if new) {setup_s:.2f} s; {args.warmup} warm-up + 2 x {args.steps} steps")

    res = {"strategy": name, "floor": FLOORS[name], "dtype": args.dtype, "setup_s": round(setup_s, 4)}
    notes = []
    if args.check_hlo:
        # Once per child (same executable): does the optimized HLO hold
        # command buffers? A check that the XLA_FLAGS setting took effect.
        if "hlo" not in _JITTED:
            try:
                example = (st["params"], x_fixed) if kind == "mlp" else (
                    (st["params"], x_fixed, t_fixed) if kind == "train" else (x_fixed,))
                text = jitted.lower(*example).compile().as_text() or ""
                _JITTED["hlo"] = {"hlo_command_buffer": "command_buffer" in text, "hlo_chars": len(text)}
            except Exception as e:
                _JITTED["hlo"] = {"note": f"HLO check failed: {common.describe_exception(e)}"}
        hlo = dict(_JITTED["hlo"])
        if "note" in hlo:
            notes.append(hlo.pop("note"))
        res.update(hlo)

    m = common.measure(step, sync, steps=args.steps, warmup=args.warmup, batch=args.batch,
                       gpu=None, max_seconds=args.max_strategy_s, tag=tag)
    sync()
    res.update(m.fields(args.samples))
    notes += m.notes
    stats = None
    try:
        stats = dev.memory_stats()
    except Exception as e:
        notes.append(f"memory_stats: {common.describe_exception(e)}")
    if stats:
        res["peak_device_bytes"] = int(stats.get("peak_bytes_in_use", 0)) or None
        res["device_bytes_in_use"] = int(stats.get("bytes_in_use", 0)) or None
    else:
        res["peak_device_bytes"] = None
    try:
        res["input_addresses"] = len({x.unsafe_buffer_pointer() for x in inputs})
        seen = set()
        for i in range(2 * R + 2):
            step(i)
            sync()
            seen.add(st["last"].unsafe_buffer_pointer())
        res["output_addresses"] = len(seen)
    except Exception as e:
        notes.append(f"buffer addresses: {common.describe_exception(e)}")
    if ref is not None:
        slot = 0 if fixed else R - 1  # the floor's input holds slot 0's data
        step(R * 1000003 + slot)
        sync()
        got = np.asarray(st["last"].astype(jnp.float32), dtype=np.float64)
        err = float(np.max(np.abs(got - ref[slot])))
    else:
        err = None
    common.finish_result(res, notes, err, args.dtype)
    return res


def child_main(args, spec: dict) -> int:
    out = {"device": None, "versions": {}, "results": []}
    path = args._child_out
    strategies = [s for s in args._strategies.split(",") if s]
    tag = f"{TAG} {args._child}"
    common.write_json(path, out)
    try:
        import jax
        import jax.numpy as jnp
        import numpy as np
        if args.dtype == "float32":
            jax.config.update("jax_default_matmul_precision", "highest")
        dev = jax.devices()[0]
        if dev.platform != "gpu":
            raise RuntimeError(f"JAX's first device is {dev} (platform {dev.platform}), not a GPU")
        out["device"] = f"{getattr(dev, 'device_kind', str(dev))}"
        try:
            import jaxlib
            jaxlib_version = getattr(jaxlib, "__version__", None) or jaxlib.version.__version__
        except Exception:
            jaxlib_version = None
        out["versions"] = {"jax": jax.__version__, "jaxlib": jaxlib_version, "numpy": np.__version__,
                           "default_matmul_precision": str(getattr(jax.config, "jax_default_matmul_precision", None))}
        common.log(tag, f"{out['device']}, jax {jax.__version__}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
        data = common.make_data(spec, args.ring, args.seed)
        ref = None
        if common.stateless(spec) and not (spec["kind"] == "chain" and args.dtype != "float32"):
            rnd = None
            if args.dtype == "bfloat16":
                def rnd(a):
                    return np.asarray(jnp.asarray(a, jnp.bfloat16).astype(jnp.float32))
            ref = {s: common.reference_output(spec, data, data["xs"][s], rnd) for s in {0, args.ring - 1}}
    except Exception as e:
        return common.cannot_run(tag, path, out, e)
    failures = 0
    for name in strategies:
        try:
            res = run_jax_strategy(name, jax, jnp, np, spec, data, args, ref)
        except Exception as e:
            res = common.failed_result(name, FLOORS[name], e, dtype=args.dtype)
            common.log(tag, f"{name} failed: {res['error']}")
            failures += 1
        out["results"].append(res)
        common.write_json(path, out)
    return 1 if failures else 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common_args(p, ORDER)
    p.add_argument("--mode-timeout", type=float, default=240,
                   help="seconds one XLA setting (one child process) may take (default 240)")
    p.add_argument("--jax-chain-fuse", action="store_true",
                   help="let XLA fuse the chain (no optimization_barrier between kernels)")
    p.add_argument("--check-hlo", dest="check_hlo", action="store_true", default=None,
                   help="record whether the compiled HLO holds command buffers (default: on except for chain)")
    p.add_argument("--no-check-hlo", dest="check_hlo", action="store_false")
    p.add_argument("--_child", choices=sorted(MODES), help=argparse.SUPPRESS)
    p.add_argument("--_child-out", dest="_child_out", help=argparse.SUPPRESS)
    p.add_argument("--_strategies", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        common.check_args(args)
        spec = common.workload_spec(args.workload, args.chain_k)
        names = common.select_strategies(args.system, FLOORS, ORDER, "jax")
    except ValueError as e:
        p.error(str(e))
    if args.check_hlo is None:
        args.check_hlo = spec["kind"] != "chain"
    if args._child:
        if not args._child_out:
            p.error("--_child needs --_child-out")
        return child_main(args, spec)
    return parent_main(args, argv, spec, names)


if __name__ == "__main__":
    sys.exit(main())
