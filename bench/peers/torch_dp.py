#!/usr/bin/env python3
"""PyTorch data-parallel peer of stablegraph's dp workload (docs/WORKLOADS.md).

Launched the way PyTorch users launch data-parallel jobs, one process per GPU:

    torchrun --standalone --nproc_per_node N bench/peers/torch_dp.py --json dp.json

(with no torchrun environment it runs one rank without a process group and
without the all-reduce). Every rank runs the same step on its shard of the
batch; rank 0 writes the JSON, with every rank's times.

The step is dp's, with the same shapes, initialisation and update, so that the
work per step is the same as stablegraph's: an MLP of L layers h = tanh(h W + b)
(width 256, 8 layers) on the rank's Bs rows, the prediction copied into y, the
mean-squared-error gradient over the whole global batch (2 / (B width)),
the backward pass writing every dW and db into ONE flat gradient buffer
(dW1 db1 ... dWL dbL, as data-parallel frameworks fuse gradients into a
bucket), one NCCL all-reduce (sum) of that buffer, then per layer
W -= lr dW and b -= lr db (one kernel each, as stablegraph's axpy). Float32,
no TF32. The batch is either global (--global-batch B, shared by the ranks:
strong scaling) or per rank (--batch-per-rank Bs, B = Bs x ranks: weak
scaling).

Strategies (each row's floor is torch-graph-fixed):

  torch-graph-fixed  the floor: the step captured once in a CUDA graph over
                     static x, target and y (the all-reduce inside it),
                     replayed with nothing moving.
  torch-eager        the step's ops and the all-reduce launched one by one,
                     inputs and outputs in a ring of --ring buffers.
  torch-graph-copy   the step's x and target copied into the graph's static
                     inputs, replay, y copied out: what a PyTorch user does to
                     replay a graph over inputs that move.

Timing is common.measure's, with the ranks aligned: before each measured step
and each batch of the throughput phase every rank waits for a barrier (a
one-element all-reduce, synchronized), so that the ranks' timed work starts
together and no rank's time includes the wait for a late peer's launch.

Each strategy first runs three steps from the initial weights and compares
the weights with a float64 numpy reference of the single-process step over
the whole global batch (max_abs_err, output_ok: within 1e-4 relative).
Bench/README.md explains the numbers.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

TAG = "torch-dp"
FIXED = "torch-graph-fixed"
FLOORS = {FIXED: FIXED, "torch-eager": FIXED, "torch-graph-copy": FIXED}
ORDER = [FIXED, "torch-eager", "torch-graph-copy"]
LAYERS, WIDTH, LR = 8, 256, 0.01
CHECK_STEPS = 3
CHECK_RTOL = 1e-4


# ---------------------------------------------------------------- the ranks


class Ranks:
    """This process's rank: torch.distributed from torchrun's environment,
    or one rank without a process group when there is none."""

    def __init__(self, torch):
        self.torch = torch
        self.dist = None
        self.rank, self.world, self.local = 0, 1, 0
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            import torch.distributed as dist
            self.rank = int(os.environ["RANK"])
            self.world = int(os.environ["WORLD_SIZE"])
            self.local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(self.local)
            dist.init_process_group("nccl", rank=self.rank, world_size=self.world)
            self.dist = dist
        self.token = None

    def all_reduce(self, t):
        """Sum t over the ranks, in place, on the current stream (captured
        when the stream captures)."""
        if self.dist is not None:
            self.dist.all_reduce(t)

    def align(self):
        """A barrier on the device and the host: returns once every rank has
        reached it."""
        if self.dist is None:
            return
        if self.token is None:
            self.token = self.torch.zeros(1, device="cuda")
        self.dist.all_reduce(self.token)
        self.torch.cuda.synchronize()

    def gather(self, obj):
        """Every rank's obj, by rank, on rank 0 (None elsewhere)."""
        if self.dist is None:
            return [obj]
        out = [None] * self.world
        self.dist.all_gather_object(out, obj)
        return out if self.rank == 0 else None

    def close(self):
        if self.dist is not None:
            self.dist.destroy_process_group()


# ---------------------------------------------------------------- data


def make_data(global_batch: int, ring: int, seed: int):
    """The initial weights and biases (uniform in +-1/sqrt(width)) and
    `ring` global inputs and targets (uniform in [-1, 1]), float32 numpy,
    from numpy's default_rng(seed): the same on every rank."""
    import numpy as np

    rng = np.random.default_rng(seed)
    f32 = np.float32
    lim = 1.0 / WIDTH ** 0.5
    W = [rng.uniform(-lim, lim, (WIDTH, WIDTH)).astype(f32) for _ in range(LAYERS)]
    b = [rng.uniform(-lim, lim, (WIDTH,)).astype(f32) for _ in range(LAYERS)]
    xs = [rng.uniform(-1, 1, (global_batch, WIDTH)).astype(f32) for _ in range(ring)]
    ts = [rng.uniform(-1, 1, (global_batch, WIDTH)).astype(f32) for _ in range(ring)]
    return {"W": W, "b": b, "xs": xs, "ts": ts}


def reference_weights(data, slots):
    """The weights after one single-process SGD step over the whole global
    batch per entry of slots (the ring slot each step reads), in float64."""
    import numpy as np

    W = [w.astype(np.float64) for w in data["W"]]
    b = [v.astype(np.float64) for v in data["b"]]
    for s in slots:
        x, t = data["xs"][s].astype(np.float64), data["ts"][s].astype(np.float64)
        hs = [x]
        for layer in range(LAYERS):
            hs.append(np.tanh(hs[-1] @ W[layer] + b[layer]))
        dh = 2.0 / t.size * (hs[-1] - t)
        dW, db = [None] * LAYERS, [None] * LAYERS
        for layer in range(LAYERS - 1, -1, -1):
            dz = dh * (1 - hs[layer + 1] ** 2)
            dW[layer] = hs[layer].T @ dz
            db[layer] = dz.sum(0)
            dh = dz @ W[layer].T
        for layer in range(LAYERS):
            W[layer] = W[layer] - LR * dW[layer]
            b[layer] = b[layer] - LR * db[layer]
    return W, b


# ---------------------------------------------------------------- the step


class Model:
    """One rank's dp step on the GPU: its weights, its gradient bucket and a
    ring of its shards of the inputs."""

    def __init__(self, torch, ranks: Ranks, data, rows: int, ring: int):
        self.torch = torch
        self.ranks = ranks
        self.rows = rows
        self.global_batch = rows * ranks.world
        dev = torch.device("cuda")
        lo, hi = ranks.rank * rows, (ranks.rank + 1) * rows

        def put(a):
            return torch.from_numpy(a).to(device=dev, dtype=torch.float32).contiguous()

        self.W = [put(w) for w in data["W"]]
        self.b = [put(v) for v in data["b"]]
        self.W0 = [w.clone() for w in self.W]
        self.b0 = [v.clone() for v in self.b]
        self.xs = [put(x[lo:hi].copy()) for x in data["xs"][:ring]]
        self.ts = [put(t[lo:hi].copy()) for t in data["ts"][:ring]]
        self.ys = [torch.empty((rows, WIDTH), device=dev) for _ in range(ring)]
        self.x_fixed, self.t_fixed = self.xs[0].clone(), self.ts[0].clone()
        self.y_fixed = torch.empty((rows, WIDTH), device=dev)
        per = WIDTH * WIDTH + WIDTH
        self.grads = torch.zeros(per * LAYERS, device=dev)
        self.dW = [self.grads[per * i:per * i + WIDTH * WIDTH].view(WIDTH, WIDTH) for i in range(LAYERS)]
        self.db = [self.grads[per * i + WIDTH * WIDTH:per * (i + 1)] for i in range(LAYERS)]
        self.ring = ring

    def step(self, x, t, y):
        """Forward keeping every h; y = hL; MSE gradient over the global
        batch; backward into the bucket; one all-reduce; SGD."""
        torch = self.torch
        hs = [x]
        h = x
        for layer in range(LAYERS):
            h = torch.addmm(self.b[layer], h, self.W[layer]).tanh_()
            hs.append(h)
        y.copy_(h)
        dh = torch.sub(h, t).mul_(2.0 / (self.global_batch * WIDTH))
        for layer in range(LAYERS - 1, -1, -1):
            dz = torch.ops.aten.tanh_backward(dh, hs[layer + 1])
            torch.mm(hs[layer].t(), dz, out=self.dW[layer])
            torch.sum(dz, 0, out=self.db[layer])
            if layer > 0:
                dh = torch.mm(dz, self.W[layer].t())
        self.ranks.all_reduce(self.grads)
        for layer in range(LAYERS):
            self.W[layer].add_(self.dW[layer], alpha=-LR)
            self.b[layer].add_(self.db[layer], alpha=-LR)

    def reset(self):
        """The initial weights again, at the same addresses (graphs keep
        theirs)."""
        for w, w0 in zip(self.W + self.b, self.W0 + self.b0):
            w.copy_(w0)

    def weights(self):
        return [w.double().cpu().numpy() for w in self.W], [v.double().cpu().numpy() for v in self.b]


class Runner:
    """One strategy over a Model: step(i) issues step i; slot(i) is the ring
    slot (input data) step i reads."""

    def __init__(self, name: str, torch, m: Model):
        R = m.ring
        stream = torch.cuda.Stream()
        self.graph = None
        if name == "torch-eager":
            def step(i):
                r = i % R
                m.step(m.xs[r], m.ts[r], m.ys[r])
            self.slot = lambda i: i % R
            self.inputs = m.xs
        elif name == FIXED:
            self.graph = capture(torch, lambda: m.step(m.x_fixed, m.t_fixed, m.y_fixed), stream, warm=3)
            g = self.graph

            def step(i):
                g.replay()
            self.slot = lambda i: 0
            self.inputs = [m.x_fixed]
        elif name == "torch-graph-copy":
            sx, st, sy = m.xs[0].clone(), m.ts[0].clone(), torch.empty_like(m.ys[0])
            self.graph = capture(torch, lambda: m.step(sx, st, sy), stream, warm=3)
            g = self.graph

            def step(i):
                r = i % R
                sx.copy_(m.xs[r])
                st.copy_(m.ts[r])
                g.replay()
                m.ys[r].copy_(sy)
            self.slot = lambda i: i % R
            self.inputs = m.xs
        else:
            raise ValueError(f"unknown strategy {name}")
        self.step = step
        torch.cuda.synchronize()


def capture(torch, fn, stream, warm=3):
    """fn captured into a new CUDAGraph on a side stream, after warm eager
    runs there (cuBLAS workspaces and NCCL's communicator are set up
    outside capture). Thread-local capture mode, so that the process
    group's watchdog thread, which queries events of earlier collectives,
    is not caught by the capture."""
    g = torch.cuda.CUDAGraph()
    cur = torch.cuda.current_stream()
    stream.wait_stream(cur)
    with torch.cuda.stream(stream):
        for _ in range(warm):
            fn()
        stream.synchronize()
        g.capture_begin(capture_error_mode="thread_local")
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
    cur.wait_stream(stream)
    return g


# ---------------------------------------------------------------- a strategy


def check(torch, m, r, data):
    """Run CHECK_STEPS steps of runner r from the initial weights and return
    the largest difference of m's weights from the numpy reference,
    relative to the largest weight, and a digest of the weights (equal on
    every rank when the ranks agree bit for bit)."""
    import numpy as np

    m.reset()
    for i in range(CHECK_STEPS):
        r.step(i)
    torch.cuda.synchronize()
    W, b = m.weights()
    rW, rb = reference_weights(data, [r.slot(i) for i in range(CHECK_STEPS)])
    scale = max(float(np.abs(w).max()) for w in rW)
    err = max(float(np.abs(g - w).max()) for g, w in zip(W + b, rW + rb)) / scale
    digest = float(sum(float(w.sum()) for w in W + b))
    return err, digest


def run_strategy(name, torch, ranks, data, rows, args):
    floor = FLOORS[name]
    tag = f"{TAG} rank {ranks.rank} {name}"
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    m = Model(torch, ranks, data, rows, args.ring)
    runner = Runner(name, torch, m)
    setup_s = time.perf_counter() - t0
    err, digest = check(torch, m, runner, data)
    ranks.align()
    ev = common.TorchEvents(torch, args.steps)
    meas = common.measure(runner.step, torch.cuda.synchronize, steps=args.steps, warmup=args.warmup,
                          batch=args.batch, gpu=ev, max_seconds=args.max_strategy_s,
                          tag=tag if ranks.rank == 0 else "", align=ranks.align)
    torch.cuda.synchronize()
    res = {"strategy": name, "floor": floor, "dtype": "float32", "rank": ranks.rank}
    res.update(meas.fields(args.samples))
    res["peak_device_bytes"] = int(torch.cuda.max_memory_reserved())
    res["input_addresses"] = len({x.data_ptr() for x in runner.inputs})
    res["setup_s"] = round(setup_s, 4)
    res["notes"] = meas.notes
    res["check"] = {"max_rel_err": err, "weights_sum": digest}
    return res


def merge_ranks(per_rank):
    """Rank 0's row, with every rank's times under "ranks" and the check
    over all of them: the worst error, and whether the ranks' weights
    agreed."""
    row = dict(per_rank[0])
    row["ranks"] = [{k: r.get(k) for k in ("rank", "step_us", "batch_us", "host_us", "gpu_us", "error")}
                    for r in per_rank]
    errs = [r["check"]["max_rel_err"] for r in per_rank if r.get("check")]
    sums = {r["check"]["weights_sum"] for r in per_rank if r.get("check")}
    notes = [n for r in per_rank for n in r.get("notes") or []]
    if len(sums) > 1:
        notes.append("the ranks' weights differ after the check's steps")
    row.pop("notes", None)
    row.pop("check", None)
    err = max(errs) if errs else None
    common.finish_result(row, notes, None, "float32")
    row["max_abs_err"] = err
    row["output_ok"] = None if err is None else (err <= CHECK_RTOL and len(sums) <= 1)
    if row["output_ok"] is False and not any("reference" in n for n in notes):
        notes.append(f"weights differ from the numpy reference by {err:.3g} (relative)")
    if notes:
        row["note"] = "; ".join(notes)
    return row


def nccl_version(torch):
    try:
        v = torch.cuda.nccl.version()
    except Exception as e:  # an API change must not stop the run
        return f"unknown ({common.describe_exception(e)})"
    return ".".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)


def device_info(torch, local):
    p = torch.cuda.get_device_properties(local)
    return f"{p.name} ({p.multi_processor_count} SMs, cc {p.major}.{p.minor}, {p.total_memory >> 20} MiB)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", default="all", help="comma-separated strategies, or 'all' (%s)" % ", ".join(ORDER))
    size = p.add_mutually_exclusive_group()
    size.add_argument("--global-batch", type=int, default=None,
                      help="rows of the global batch, shared by the ranks (strong scaling; default 8)")
    size.add_argument("--batch-per-rank", type=int, default=None,
                      help="rows per rank; the global batch is this times the ranks (weak scaling)")
    p.add_argument("--steps", type=int, default=300, help="measured steps per phase (default 300)")
    p.add_argument("--warmup", type=int, default=20, help="warm-up steps (default 20)")
    p.add_argument("--batch", type=int, default=10,
                   help="steps per batch in the throughput phase (default 10, as stablegraph's wall time)")
    p.add_argument("--ring", type=int, default=2, help="input/output buffers the moving strategies rotate through")
    p.add_argument("--seed", type=int, default=1, help="seed of the data (default 1)")
    p.add_argument("--json", default="", metavar="FILE", help="rank 0 writes the results to FILE")
    p.add_argument("--samples", action="store_true", help="include per-step samples in the JSON")
    p.add_argument("--max-strategy-s", type=float, default=60,
                   help="cap on the measured phases of one strategy, seconds (default 60)")
    args = p.parse_args(argv)
    try:
        for n in ("steps", "batch", "ring"):
            if getattr(args, n) <= 0:
                raise ValueError(f"--{n} must be positive")
        if args.warmup < 0:
            raise ValueError("--warmup must not be negative")
        for n in ("global_batch", "batch_per_rank"):
            v = getattr(args, n)
            if v is not None and v <= 0:
                raise ValueError(f"--{n.replace('_', '-')} must be positive")
        names = common.select_strategies(args.system, FLOORS, ORDER, "pytorch")
    except ValueError as e:
        p.error(str(e))

    world = int(os.environ.get("WORLD_SIZE", "1")) if "RANK" in os.environ else 1
    if args.batch_per_rank is not None:
        rows, global_batch = args.batch_per_rank, args.batch_per_rank * world
    else:
        global_batch = args.global_batch or 8
        if global_batch % world:
            p.error(f"--global-batch {global_batch} does not split into {world} equal shards")
        rows = global_batch // world
    scaling = "weak" if args.batch_per_rank is not None else "strong"
    spec = {"name": "dp", "kind": "dp", "layers": LAYERS, "width": WIDTH, "batch": global_batch,
            "batch_per_rank": rows, "ranks": world, "scaling": scaling, "lr": LR}
    args.dtype = "float32"
    doc = common.base_doc("pytorch", args, spec)
    doc["launch"] = "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else ("environment" if world > 1 else "single process")
    doc["timing"]["alignment"] = ("before each measured step and each batch every rank waits for a barrier "
                                  "(a one-element all-reduce, synchronized); times are rank 0's, every rank's under ranks")
    rank0 = "RANK" not in os.environ or os.environ["RANK"] == "0"
    if rank0:
        common.write_json(args.json, doc)

    try:
        import numpy as np
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False: no GPU visible to PyTorch")
        torch.set_float32_matmul_precision("highest")
        ranks = Ranks(torch)
        doc["device"] = device_info(torch, ranks.local)
        doc["versions"].update({"torch": torch.__version__, "cuda": torch.version.cuda, "numpy": np.__version__,
                                "nccl": nccl_version(torch) if ranks.dist else None,
                                "NCCL_GRAPH_REGISTER": os.environ.get("NCCL_GRAPH_REGISTER"),
                                "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE")})
        data = make_data(global_batch, args.ring, args.seed)
    except Exception as e:
        if rank0:
            return common.cannot_run(TAG, args.json, doc, e)
        raise
    if ranks.rank == 0:
        common.log(TAG, f"{doc['device']}, torch {torch.__version__}, {world} rank(s), {rows} rows each "
                        f"({scaling} scaling, global batch {global_batch})")

    failures = 0
    for name in names:
        try:
            res = run_strategy(name, torch, ranks, data, rows, args)
        except Exception as e:
            # A rank that fails mid-strategy leaves the others in a
            # collective: the launcher's timeout ends them.
            res = common.failed_result(name, FLOORS[name], e, dtype="float32", rank=ranks.rank)
            common.log(TAG, f"rank {ranks.rank}: {name} failed: {res['error']}")
        per_rank = ranks.gather(res)
        if per_rank is not None:
            row = per_rank[0] if "error" in per_rank[0] else merge_ranks(per_rank)
            if any("error" in r for r in per_rank):
                failures += 1
                if "error" not in row:
                    row["error"] = "; ".join(f"rank {r.get('rank')}: {r['error']}" for r in per_rank if "error" in r)
            doc["results"].append(row)
            common.write_json(args.json, doc)
    ranks.close()
    if ranks.rank != 0:
        return 0
    return common.finish_run(TAG, args.json, doc, failures,
                             f"done: {len(names) - failures} of {len(names)} strategies measured"
                             + (f"; wrote {args.json}" if args.json else ""))


if __name__ == "__main__":
    sys.exit(main())
