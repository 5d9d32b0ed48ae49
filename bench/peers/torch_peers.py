#!/usr/bin/env python3
"""PyTorch peers of stablegraph's workloads (docs/WORKLOADS.md).

Strategies (each row's floor is torch-graph-fixed, the same graph replayed
with nothing moving):

  torch-eager            the step's ops launched one by one every step.
  torch-graph-copy       one CUDA graph captured over static buffers; every
                         step copies the step's input (and target) into the
                         static input, replays, and copies the static output
                         into the caller's output buffer. Both copies count.
  torch-graph-fixed      the floor: the same graph replayed on the same static
                         input, no copy in or out.
  torch-recapture        every step captures a new graph directly over the
                         step's own input and output buffers (capture_end
                         instantiates it) and replays it. Uses
                         CUDAGraph.capture_begin/capture_end on a side stream,
                         not the torch.cuda.graph context manager, whose
                         synchronize + gc.collect + empty_cache would be
                         charged to the step as well. All captures share one
                         memory pool; the two newest graphs are kept alive.
  torch-recapture-update (extra) every step captures a new graph
                         (keep_graph=True, not instantiated) and applies it to
                         the first graph's executable with cuGraphExecUpdate
                         (libcuda through ctypes), then replays that.

Inputs at a new address every step: a ring of --ring (default 2) inputs,
targets and outputs, allocated and filled before timing; step i uses slot
i mod ring, so the graph's captured addresses are never the step's (graph-copy)
or change every step (recapture). Allocating a fresh tensor per step would add
the allocator and a copy to every strategy's step; the ring does not.

All float32 matmuls run in full float32 (torch.set_float32_matmul_precision
("highest"): no TF32), like stablegraph's kernels.

Run with --help for the flags; bench/README.md explains the numbers.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

FIXED = "torch-graph-fixed"
FLOORS = {
    "torch-graph-fixed": FIXED,
    "torch-eager": FIXED,
    "torch-graph-copy": FIXED,
    "torch-recapture": FIXED,
    "torch-recapture-update": FIXED,
}
# Run order: the floor first, so that it exists even if time runs out.
ORDER = ["torch-graph-fixed", "torch-eager", "torch-graph-copy", "torch-recapture", "torch-recapture-update"]

TAG = "torch"


# ---------------------------------------------------------------- workload


class Workload:
    """State, input ring and output ring of one workload on the GPU, and the
    step itself. step(x, t, y) issues one step on the current stream, reading
    input x (and target t for train) and writing the output into y."""

    def __init__(self, torch, spec: dict, data: dict, dtype, ring: int):
        self.torch = torch
        self.spec = spec
        self.kind = spec["kind"]
        dev = torch.device("cuda")

        def put(a):
            return torch.from_numpy(a).to(device=dev, dtype=dtype).contiguous()

        if self.kind in ("mlp", "train"):
            self.W = [put(w) for w in data["W"]]
            self.b = [put(b) for b in data["b"]]
            out_shape = (spec["batch"], spec["width"])
        else:
            n = spec["n"]
            self.bvec = torch.full((n,), spec["b"], device=dev, dtype=dtype)
            self.tmp = [torch.empty(n, device=dev, dtype=dtype) for _ in range(2)]
            out_shape = (n,)
        self.xs = [put(x) for x in data["xs"][:ring]]
        self.ts = [put(t) for t in data["ts"][:ring]] if self.kind == "train" else [None] * ring
        self.ys = [torch.empty(out_shape, device=dev, dtype=dtype) for _ in range(ring)]
        # The fixed buffers (floors): separate buffers holding slot 0's data.
        self.x_fixed = self.xs[0].clone()
        self.t_fixed = self.ts[0].clone() if self.kind == "train" else None
        self.y_fixed = torch.empty(out_shape, device=dev, dtype=dtype)
        self.ring = ring

    def step(self, x, t, y):
        if self.kind == "mlp":
            self._mlp(x, y)
        elif self.kind == "train":
            self._train(x, t, y)
        else:
            self._chain(x, y)

    def _forward(self, x, y, keep):
        """tanh(h W + b) per layer: one addmm (GEMM with the bias) and one
        in-place tanh per layer (2L launches); the last layer writes y."""
        torch = self.torch
        h = x
        L = len(self.W)
        for layer in range(L):
            if layer == L - 1:
                torch.addmm(self.b[layer], h, self.W[layer], out=y)
                h = y.tanh_()
            else:
                h = torch.addmm(self.b[layer], h, self.W[layer]).tanh_()
            if keep is not None:
                keep.append(h)
        return h

    def _mlp(self, x, y):
        self._forward(x, y, None)

    def _train(self, x, t, y):
        """Forward keeping every h; MSE gradient; backward and SGD, as
        docs/WORKLOADS.md defines it (each dh(l-1) from Wl before Wl moves)."""
        torch = self.torch
        hs = [x]
        self._forward(x, y, hs)
        bt, w = self.spec["batch"], self.spec["width"]
        lr = self.spec["lr"]
        dh = torch.sub(y, t).mul_(2.0 / (bt * w))
        for layer in range(len(self.W) - 1, -1, -1):
            dz = torch.ops.aten.tanh_backward(dh, hs[layer + 1])
            dW = torch.mm(hs[layer].t(), dz)
            db = dz.sum(0)
            if layer > 0:
                dh = torch.mm(dz, self.W[layer].t())
            self.W[layer].add_(dW, alpha=-lr)
            self.b[layer].add_(db, alpha=-lr)

    def _chain(self, x, y):
        """K one-kernel axpb's: t0 = a x + b, t(i mod 2) = a t((i-1) mod 2) + b,
        the K-th writes y. torch.add(bvec, src, alpha=a) is bvec + a*src."""
        torch = self.torch
        a, k = self.spec["a"], self.spec["k"]
        torch.add(self.bvec, x, alpha=a, out=self.tmp[0])
        src = self.tmp[0]
        for i in range(2, k):
            dst = self.tmp[i % 2]
            torch.add(self.bvec, src, alpha=a, out=dst)
            src = dst
        torch.add(self.bvec, src, alpha=a, out=y)


# ---------------------------------------------------------------- graphs


def capture(torch, fn, stream, *, pool=None, keep_graph=False, warm=0, lean=False):
    """Capture fn into a new CUDAGraph on stream (a side stream, as PyTorch
    requires). warm runs fn that many times on the stream first (cuBLAS
    handles and workspaces are created outside capture). lean skips the
    stream joins, for the per-step re-capture where nothing runs on the
    side stream."""
    g = torch.cuda.CUDAGraph(keep_graph=True) if keep_graph else torch.cuda.CUDAGraph()
    cur = torch.cuda.current_stream()
    if not lean:
        stream.wait_stream(cur)
    with torch.cuda.stream(stream):
        for _ in range(warm):
            fn()
        if warm:
            stream.synchronize()
        g.capture_begin(pool=pool)
        ok = False
        try:
            fn()
            ok = True
        finally:
            try:
                g.capture_end()
            except Exception:
                if ok:
                    raise
                # fn's own error is the one to report.
    if not lean:
        cur.wait_stream(stream)
    return g


class ExecUpdater:
    """cuGraphExecUpdate_v2 from libcuda through ctypes (no cuda-python
    needed): applies a new graph's parameters to an executable graph of the
    same topology."""

    class _Info(ctypes.Structure):
        _fields_ = [("result", ctypes.c_int), ("errorNode", ctypes.c_void_p),
                    ("errorFromNode", ctypes.c_void_p)]

    def __init__(self):
        names = ["libcuda.so.1", "libcuda.so"]
        errs = []
        self.lib = None
        for n in names:
            try:
                self.lib = ctypes.CDLL(n)
                break
            except OSError as e:
                errs.append(f"{n}: {e}")
        if self.lib is None:
            raise RuntimeError("cannot load libcuda: " + "; ".join(errs))
        self.fn = self.lib.cuGraphExecUpdate_v2
        self.fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(self._Info)]
        self.fn.restype = ctypes.c_int
        self.info = self._Info()

    def _name(self, rc):
        s = ctypes.c_char_p()
        try:
            self.lib.cuGetErrorName(rc, ctypes.byref(s))
            return s.value.decode() if s.value else str(rc)
        except Exception:
            return str(rc)

    def update(self, exec_handle: int, graph_handle: int) -> None:
        rc = self.fn(ctypes.c_void_p(exec_handle), ctypes.c_void_p(graph_handle), ctypes.byref(self.info))
        if rc != 0:
            raise RuntimeError(f"cuGraphExecUpdate_v2: {self._name(rc)} ({rc}), "
                               f"update result {self.info.result}")


# ---------------------------------------------------------------- strategies


class Runner:
    """One strategy over one Workload: step(i) issues step i; out_for(i) is
    the buffer that holds step i's output; close() drops the graphs."""

    def __init__(self, name: str, torch, wl: Workload, args):
        self.name = name
        self.torch = torch
        self.wl = wl
        self.graphs = collections.deque(maxlen=2)
        self.g = None
        R = wl.ring
        stream = torch.cuda.Stream()
        self.stream = stream
        x_slots = list(range(R))

        if name == "torch-eager":
            def step(i):
                r = i % R
                wl.step(wl.xs[r], wl.ts[r], wl.ys[r])
            self.out_for = lambda i: wl.ys[i % R]
            self.inputs = [wl.xs[r] for r in x_slots]

        elif name == "torch-graph-fixed":
            self.g = capture(torch, lambda: wl.step(wl.x_fixed, wl.t_fixed, wl.y_fixed), stream, warm=3)
            g = self.g

            def step(i):
                g.replay()
            self.out_for = lambda i: wl.y_fixed
            self.inputs = [wl.x_fixed]

        elif name == "torch-graph-copy":
            sx = wl.xs[0].clone()
            st = wl.ts[0].clone() if wl.kind == "train" else None
            sy = torch.empty_like(wl.ys[0])
            self.g = capture(torch, lambda: wl.step(sx, st, sy), stream, warm=3)
            g = self.g
            train = wl.kind == "train"

            def step(i):
                r = i % R
                sx.copy_(wl.xs[r])
                if train:
                    st.copy_(wl.ts[r])
                g.replay()
                wl.ys[r].copy_(sy)
            self.out_for = lambda i: wl.ys[i % R]
            self.inputs = [wl.xs[r] for r in x_slots]
            self.static = (sx, st, sy)

        elif name == "torch-recapture":
            pool = torch.cuda.graph_pool_handle()
            # Warm-up outside capture (cuBLAS handles, workspaces), once.
            first = capture(torch, lambda: wl.step(wl.xs[0], wl.ts[0], wl.ys[0]), stream, pool=pool, warm=3)
            self.graphs.append(first)
            graphs = self.graphs

            def step(i):
                r = i % R
                g = capture(torch, lambda: wl.step(wl.xs[r], wl.ts[r], wl.ys[r]), stream, pool=pool, lean=True)
                g.replay()
                graphs.append(g)  # drops the graph of two steps ago
            self.out_for = lambda i: wl.ys[i % R]
            self.inputs = [wl.xs[r] for r in x_slots]

        elif name == "torch-recapture-update":
            updater = ExecUpdater()
            pool = torch.cuda.graph_pool_handle()
            self.g = capture(torch, lambda: wl.step(wl.xs[0], wl.ts[0], wl.ys[0]), stream, pool=pool, warm=3)
            base = self.g
            exec_handle = base.raw_cuda_graph_exec()
            graphs = self.graphs

            def step(i):
                r = i % R
                g = capture(torch, lambda: wl.step(wl.xs[r], wl.ts[r], wl.ys[r]), stream,
                            pool=pool, keep_graph=True, lean=True)
                updater.update(exec_handle, g.raw_cuda_graph())
                base.replay()
                graphs.append(g)  # its memory is what base now points at
            self.out_for = lambda i: wl.ys[i % R]
            self.inputs = [wl.xs[r] for r in x_slots]

        else:
            raise ValueError(f"unknown strategy {name}")
        self.step = step
        torch.cuda.synchronize()

    def close(self):
        self.graphs.clear()
        self.g = None
        self.step = None


def release(torch):
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def run_strategy(name, torch, spec, data, dtype, args, ref):
    floor = FLOORS[name]
    tag = f"{TAG} {spec['name']} {name}"
    release(torch)
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    wl = Workload(torch, spec, data, dtype, args.ring)
    runner = Runner(name, torch, wl, args)
    try:
        setup_s = time.perf_counter() - t0
        common.log(tag, f"set up in {setup_s:.2f} s; {args.warmup} warm-up + 2 x {args.steps} steps")
        ev = common.TorchEvents(torch, args.steps)
        m = common.measure(runner.step, torch.cuda.synchronize, steps=args.steps, warmup=args.warmup,
                           batch=args.batch, gpu=ev, max_seconds=args.max_strategy_s, tag=tag)
        torch.cuda.synchronize()
        res = {"strategy": name, "floor": floor, "dtype": args.dtype}
        res.update(m.fields(args.samples))
        res["peak_device_bytes"] = int(torch.cuda.max_memory_reserved())
        res["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
        res["input_addresses"] = len({x.data_ptr() for x in runner.inputs})
        res["setup_s"] = round(setup_s, 4)
        notes = list(m.notes)
        # Check one step's output against numpy: the floor on its fixed
        # input (slot 0's data), the others on the last slot, whose data is
        # not what any graph was captured over.
        if ref is not None:
            slot = 0 if name == FIXED else args.ring - 1
            i = args.ring * 1000003 + slot  # a step index on that slot
            runner.step(i)
            torch.cuda.synchronize()
            got = runner.out_for(i).double().cpu()
            err = float((got - torch.from_numpy(ref[slot])).abs().max().item())
        else:
            err = None
        common.finish_result(res, notes, err, args.dtype)
        return res
    finally:
        runner.close()
        del runner, wl


def device_info(torch):
    p = torch.cuda.get_device_properties(0)
    return f"{p.name} ({p.multi_processor_count} SMs, cc {p.major}.{p.minor}, {p.total_memory >> 20} MiB)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common_args(p, ORDER)
    args = p.parse_args(argv)
    deadline = time.monotonic() + args.time_limit if args.time_limit > 0 else None
    try:
        common.check_args(args)
        spec = common.workload_spec(args.workload, args.chain_k)
        names = common.select_strategies(args.system, FLOORS, ORDER, "pytorch")
    except ValueError as e:
        p.error(str(e))
    doc = common.base_doc("pytorch", args, spec)
    common.write_json(args.json, doc)

    try:
        import torch
        import numpy as np
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False: no GPU visible to PyTorch")
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
        try:
            torch.set_float32_matmul_precision("highest")
        except Exception as e:  # an API change must not stop the run
            common.log(TAG, f"set_float32_matmul_precision: {e}")
        torch.cuda.init()
        doc["device"] = device_info(torch)
        doc["versions"].update({
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "numpy": np.__version__,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
        })
        common.log(TAG, f"{doc['device']}, torch {torch.__version__}, CUDA {torch.version.cuda}")
        data = common.make_data(spec, args.ring, args.seed)
        ref = None
        # bfloat16 cannot hold the chain's a = 0.999 (it rounds to 0.9961),
        # so the chain is checked in float32 only.
        if common.stateless(spec) and not (spec["kind"] == "chain" and args.dtype != "float32"):
            rnd = None
            if args.dtype == "bfloat16":
                def rnd(a):
                    return torch.from_numpy(np.ascontiguousarray(a)).to(torch.bfloat16).float().numpy()
            ref = {s: common.reference_output(spec, data, data["xs"][s], rnd) for s in {0, args.ring - 1}}
    except Exception as e:
        return common.cannot_run(TAG, args.json, doc, e)

    failures = 0
    for name in names:
        if deadline is not None and time.monotonic() > deadline:
            res = common.skipped_result(name, FLOORS[name], "time limit reached", dtype=args.dtype)
            common.log(TAG, f"{name}: skipped (time limit)")
        else:
            try:
                res = run_strategy(name, torch, spec, data, dtype, args, ref)
            except Exception as e:
                res = common.failed_result(name, FLOORS[name], e, dtype=args.dtype)
                common.log(TAG, f"{name} failed: {res['error']}")
                try:
                    release(torch)
                except Exception as e2:  # a sticky CUDA error: later strategies will say so
                    common.log(TAG, f"cleanup after failure: {common.describe_exception(e2)}")
        if "error" in res:
            failures += 1
        doc["results"].append(res)
        common.write_json(args.json, doc)
    return common.finish_run(TAG, args.json, doc, failures,
                             f"done: {len(names) - failures} of {len(names)} strategies measured"
                             + (f"; wrote {args.json}" if args.json else ""))


if __name__ == "__main__":
    sys.exit(main())
