#!/usr/bin/env python3
"""PyTorch tensor-parallel peer of stablegraph's gpt2-decode on several ranks
(docs/MULTI-GPU.md, "Tensor-parallel GPT-2 decode"), launched as PyTorch users
launch it, one process per GPU:

    torchrun --standalone --nproc_per_node N bench/peers/torch_gpt2_tp.py \\
        --weights FILE --batches 1,8 --json tp.json

(without torchrun's environment it runs one rank: the whole model, no
all-reduce). The decode step is torch_gpt2.py's, split as stablegraph splits
it (models/gpt2/shard.go, Megatron-LM's split): each rank holds heads/N heads
and 4d/N MLP columns, sliced from the same whole-model weights file (c_attn's
q, k and v column blocks and c_fc's columns, the rows of both c_proj), its
caches hold its heads only, and after each of a block's two projections one
torch.distributed.all_reduce (sum, NCCL) adds the ranks' partial sums before
the bias is added once. The embeddings, layer norms and the LM head are
whole on every rank. The all-reduces are captured in the CUDA graph with the
rest of the step.

Strategies (every row's floor is torch-graph-fixed), each at every batch of
--batches:

  torch-graph-fixed      the step captured once, replayed with nothing moving.
  torch-eager            the step's ops and all-reduces launched one by one.
  torch-graph-swap-copy  stablegraph's swap pattern as a static-graph user
                         does it (torch_gpt2.py): swapped rows' caches copied
                         out of and into the graph's batched cache, tokens and
                         positions copied in, replay, logits copied out.

Timing is common.measure's with the ranks aligned before each measured step
and each batch (a one-element all-reduce, synchronized: torch_dp.py); rank 0
writes the JSON with every rank's times.

With --check PATTERN (PATTERN with {batch}: the dump of `stablegraph run
--workload gpt2-decode --pattern fixed --strategy eager --steps 1 --warmup 0
--dump FILE` on ONE GPU at that batch), every strategy runs one more step with
row r holding sequence r and compares its logits with the single-GPU step's
(max_abs_err_vs_stablegraph; output_ok within --tolerance, default 1e-4).

NCCL alone: after the strategies (and alone with --allreduce-only, which needs
no weights) each batch B's all-reduce of d x B floats, the size of the step's,
is timed on its own: eager (events around one all_reduce), one all_reduce in a
CUDA graph, and a graph of 2 x layers all-reduces (a token's, back to back)
whose GPU time is what NCCL takes of a token. Where PyTorch's symmetric memory
is available, the same graph of one-shot all-reduces over peer memory
(torch.ops.symm_mem.one_shot_all_reduce: each rank reads the others' buffers
over NVLink and adds them in one kernel) is timed beside it: the known remedy
for small all-reduces. NCCL_ALGO and NCCL_PROTO (e.g. NCCL_PROTO=LL) are
NCCL's own settings, read from the environment and recorded.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import gpt2_data  # noqa: E402
import torch_dp  # noqa: E402
import torch_gpt2  # noqa: E402

TAG = "torch gpt2 tp"
FIXED = "torch-graph-fixed"
ORDER = [FIXED, "torch-eager", "torch-graph-swap-copy"]
FLOORS = {s: FIXED for s in ORDER}
NCCL_ENV = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_GRAPH_REGISTER", "NCCL_NVLS_ENABLE", "NCCL_P2P_LEVEL")


# ---------------------------------------------------------------- the split


def split_of(name: str):
    """How a rank takes its part of weight name: ("columns", groups),
    ("rows", 1) or ("replicated", 1), as models/gpt2/shard.go splitOf."""
    if name.endswith((".attn.c_attn.weight", ".attn.c_attn.bias")):
        return "columns", 3
    if name.endswith((".mlp.c_fc.weight", ".mlp.c_fc.bias")):
        return "columns", 1
    if name.endswith((".attn.c_proj.weight", ".mlp.c_proj.weight")):
        return "rows", 1
    return "replicated", 1


def shard(name: str, a, rank: int, world: int):
    """Rank rank's part of the whole model's weight a (numpy), a copy."""
    import numpy as np

    kind, groups = split_of(name)
    if kind == "rows":
        n = a.shape[0] // world
        return np.ascontiguousarray(a[rank * n:(rank + 1) * n])
    if kind == "columns":
        block = a.shape[-1] // groups
        part = block // world
        return np.ascontiguousarray(np.concatenate(
            [a[..., g * block + rank * part:g * block + (rank + 1) * part] for g in range(groups)], axis=-1))
    return np.ascontiguousarray(a)


# ---------------------------------------------------------------- the model


class TPModel(torch_gpt2.Model):
    """One rank's part of the decode step (see the module's doc)."""

    def __init__(self, torch, cfg: gpt2_data.Config, weights: dict, ranks):
        if cfg.heads % ranks.world:
            raise ValueError(f"{cfg.heads} heads do not split over {ranks.world} ranks")
        self.ranks = ranks
        part = {k: shard(k, v, ranks.rank, ranks.world) for k, v in weights.items()}
        super().__init__(torch, cfg, part)
        self.heads = cfg.heads // ranks.world
        self.dl = self.heads * cfg.hd
        self.col0 = ranks.rank * self.dl

    def new_cache(self, rows: int):
        """The batched cache of the rank's heads: [layers, 2, rows, heads/N, positions, head dim]."""
        c = self.cfg
        return self.torch.zeros((c.layers, 2, rows, self.heads, c.npos, c.hd), device="cuda", dtype=self.torch.float32)

    def new_sequences(self, count: int):
        return TPSequences(self.torch, self, count)

    def hidden(self, tokens, pos, kv):
        torch, F, c = self.torch, self.F, self.cfg
        B, d, H, hd, dl = c.batch, c.d, self.heads, c.hd, self.dl
        x = torch.index_select(self.wte, 0, tokens) + torch.index_select(self.wpe, 0, pos)
        mask = (self.positions[None, :] > pos[:, None])[:, None, None, :]  # [B, 1, 1, P]
        for l, w in enumerate(self.layers):
            h = F.layer_norm(x, (d,), w["ln_1.weight"], w["ln_1.bias"], gpt2_data.EPS)
            qkv = torch.addmm(w["attn.c_attn.bias"], h, w["attn.c_attn.weight"])  # [B, 3 dl]: the rank's q | k | v
            q, k, v = qkv.split(dl, dim=1)
            kv[l, 0][self.rows, :, pos] = k.reshape(B, H, hd)
            kv[l, 1][self.rows, :, pos] = v.reshape(B, H, hd)
            s = torch.matmul(q.reshape(B, H, 1, hd), kv[l, 0].transpose(-1, -2)) * self.scale
            p = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1)
            a = torch.matmul(p, kv[l, 1]).reshape(B, dl)
            o = torch.mm(a, w["attn.c_proj.weight"])  # the rank's partial sum
            self.ranks.all_reduce(o)
            x = x + o + w["attn.c_proj.bias"]  # the bias once, after the sum
            h = F.layer_norm(x, (d,), w["ln_2.weight"], w["ln_2.bias"], gpt2_data.EPS)
            f = F.gelu(torch.addmm(w["mlp.c_fc.bias"], h, w["mlp.c_fc.weight"]), approximate="tanh")
            o = torch.mm(f, w["mlp.c_proj.weight"])
            self.ranks.all_reduce(o)
            x = x + o + w["mlp.c_proj.bias"]
        return F.layer_norm(x, (d,), self.lnf_w, self.lnf_b, gpt2_data.EPS)


class TPSequences:
    """The caller's sequences, each with its cache of the rank's heads
    [layers, 2, heads/N, positions, head dim]: the rank's columns of the
    whole model's initial prefix (gpt2_data.cache_prefix)."""

    def __init__(self, torch, model: TPModel, count: int):
        c = model.cfg
        self.caches = []
        for s in range(count):
            t = torch.zeros((c.layers, 2, model.heads, c.npos, c.hd), device="cuda", dtype=torch.float32)
            p = c.seq_pos(s)
            if p:
                pre = gpt2_data.cache_prefix(c, s)[..., model.col0:model.col0 + model.dl]
                pre = pre.reshape(c.layers, 2, p, model.heads, c.hd).transpose(0, 1, 3, 2, 4)
                t[:, :, :, :p, :].copy_(torch.from_numpy(pre.copy()).to(device="cuda", dtype=torch.float32))
            self.caches.append(t)


# ---------------------------------------------------------------- strategies


def read_check(path: str, cfg):
    """The single-GPU eager dump at path, for cfg's batch."""
    import numpy as np

    dump, meta = gpt2_data.read_safetensors(path)
    logits = np.asarray(dump["logits"], dtype=np.float64)
    if logits.shape != (cfg.batch, cfg.vocab) or list(dump["sequences"]) != list(range(cfg.batch)):
        raise ValueError(f"{path}: logits {logits.shape} or rows {list(dump['sequences'])} are not "
                         f"a fixed-pattern step of batch {cfg.batch} (run with --pattern fixed)")
    return {"tokens": [int(t) for t in dump["tokens"]], "positions": [int(t) for t in dump["positions"]],
            "logits": logits, "file": path, "metadata": meta}


def run_strategy(name, torch, model: TPModel, ranks, args, check):
    c = model.cfg
    tag = f"{TAG} rank {ranks.rank} b{c.batch} {name}"
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    runner = torch_gpt2.Runner(name, torch, model, args, capture_fn=torch_dp.capture)
    try:
        setup_s = time.perf_counter() - t0
        ranks.align()
        m = common.measure(runner.step, torch.cuda.synchronize, steps=args.steps, warmup=args.warmup,
                           batch=args.throughput_batch, gpu=common.TorchEvents(torch, args.steps),
                           max_seconds=args.max_strategy_s, tag=tag if ranks.rank == 0 else "", align=ranks.align)
        torch.cuda.synchronize()
        res = {"strategy": name, "floor": FLOORS[name], "dtype": "float32", "rank": ranks.rank, "batch": c.batch}
        res.update(m.fields(args.samples))
        res["peak_device_bytes"] = int(torch.cuda.max_memory_reserved())
        res["input_addresses"] = runner.addresses
        res["setup_s"] = round(setup_s, 4)
        res["notes"] = list(m.notes)
        if name == "torch-graph-swap-copy":
            res["swaps_per_step"] = c.swaps_per_step()
            res["swap_bytes_per_step"] = 2 * c.swaps_per_step() * 4 * c.layers * 2 * c.npos * model.dl
        res["max_abs_err_vs_stablegraph"] = None
        if check is not None:
            got = runner.check(check["tokens"], check["positions"]).double().cpu().numpy()
            res["max_abs_err_vs_stablegraph"] = float(abs(got - check["logits"]).max())
            res["logits_sum"] = float(got.sum())
        return res
    finally:
        runner.close()
        del runner


def merge_ranks(per_rank, tolerance):
    """Rank 0's row with every rank's times under "ranks", and the check
    over all of them: the worst difference from the single-GPU step, and
    whether every rank computed the same logits."""
    row = dict(per_rank[0])
    row["ranks"] = [{k: r.get(k) for k in ("rank", "step_us", "batch_us", "host_us", "gpu_us", "error")}
                    for r in per_rank]
    notes = [n for r in per_rank for n in r.get("notes") or []]
    row.pop("notes", None)
    errs = [r["max_abs_err_vs_stablegraph"] for r in per_rank if r.get("max_abs_err_vs_stablegraph") is not None]
    sums = {r.get("logits_sum") for r in per_rank if r.get("logits_sum") is not None}
    row.pop("logits_sum", None)
    row["max_abs_err_vs_stablegraph"] = max(errs) if errs else None
    row["output_ok"] = None
    if errs:
        row["output_ok"] = max(errs) <= tolerance and len(sums) <= 1
        if len(sums) > 1:
            notes.append("the ranks' logits differ")
        if max(errs) > tolerance:
            notes.insert(0, f"logits differ from stablegraph's single-GPU step by {max(errs):.3g} (tolerance {tolerance:g})")
        else:
            notes.insert(0, f"logits vs stablegraph's single-GPU eager: max abs {max(errs):.2g}")
    if notes:
        row["note"] = "; ".join(notes)
    return row


# ---------------------------------------------------------------- NCCL alone


def time_gpu(torch, ranks, fn, steps, warmup):
    """GPU time of fn() by events around it, p50/p90 over steps, the ranks
    aligned before each."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = common.TorchEvents(torch, steps)
    for j in range(steps):
        ranks.align()
        ev.begin(j)
        fn()
        ev.end(j)
        ev.wait(j)
    return common.summarize(ev.elapsed_us(steps))


def allreduce_alone(torch, ranks, d: int, layers: int, batch: int, args):
    """NCCL's all-reduce of d x batch floats on its own (see the module's
    doc), and PyTorch's one-shot all-reduce over symmetric memory where it
    can be used."""
    n = d * batch
    per_token = 2 * layers
    out = {"batch": batch, "floats": n, "bytes": 4 * n, "per_token": per_token}
    t = torch.zeros(n, device="cuda")
    stream = torch.cuda.Stream()
    out["eager_us"] = time_gpu(torch, ranks, lambda: ranks.all_reduce(t), args.steps, args.warmup)

    def many(k, op):
        def f():
            for _ in range(k):
                op()
        return f

    g1 = torch_dp.capture(torch, lambda: ranks.all_reduce(t), stream)
    out["graph_one_us"] = time_gpu(torch, ranks, g1.replay, args.steps, args.warmup)
    gt = torch_dp.capture(torch, many(per_token, lambda: ranks.all_reduce(t)), stream)
    out["graph_token_us"] = time_gpu(torch, ranks, gt.replay, args.steps, args.warmup)
    del g1, gt
    sym = out["symm_one_shot"] = {}
    try:
        import torch.distributed._symmetric_memory as symm_mem
        group = ranks.dist.group.WORLD.group_name
        buf = symm_mem.empty(n, device="cuda", dtype=torch.float32)
        symm_mem.rendezvous(buf, group)
        res = torch.empty_like(buf)
        op = torch.ops.symm_mem.one_shot_all_reduce_out

        def one_shot():
            op(buf, "sum", group, res)
        one_shot()
        torch.cuda.synchronize()
        sym["eager_us"] = time_gpu(torch, ranks, one_shot, args.steps, args.warmup)
        gs = torch_dp.capture(torch, many(per_token, one_shot), stream)
        sym["graph_token_us"] = time_gpu(torch, ranks, gs.replay, args.steps, args.warmup)
        del gs
    except Exception as e:  # not built in, or not on this machine: say why
        sym["error"] = common.describe_exception(e)
    return out


# ---------------------------------------------------------------- main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", default="", metavar="FILE",
                   help="the whole model's safetensors weights stablegraph wrote (run --workload gpt2-decode --weights FILE)")
    p.add_argument("--batches", default="1,8", help="comma-separated batches (sequences per step), each run in turn (default 1,8)")
    p.add_argument("--heads", type=int, default=None, help="attention heads (default: the weights' metadata, else 12)")
    p.add_argument("--pos", type=int, default=None, help="decode position (default: the weights' metadata, else 128)")
    p.add_argument("--seed", type=int, default=None, help="seed of the inputs (default: the weights' metadata, else 1)")
    p.add_argument("--check", default="", metavar="PATTERN",
                   help="stablegraph's single-GPU eager dump per batch, {batch} in the path replaced by it")
    p.add_argument("--tolerance", type=float, default=1e-4, help="max abs logits difference allowed (default 1e-4)")
    p.add_argument("--system", default="all", help="comma-separated strategies or 'all' (%s)" % ", ".join(ORDER))
    p.add_argument("--allreduce-only", action="store_true",
                   help="time NCCL's all-reduce alone, no model (its width and layers from --weights when given)")
    p.add_argument("--width", type=int, default=768, help="--allreduce-only without --weights: the model width d (default 768)")
    p.add_argument("--layers", type=int, default=12, help="--allreduce-only without --weights: layers (2 all-reduces each; default 12)")
    p.add_argument("--steps", type=int, default=100, help="measured steps per phase (default 100)")
    p.add_argument("--warmup", type=int, default=10, help="warm-up steps (default 10)")
    p.add_argument("--throughput-batch", type=int, default=10, help="steps per batch in the throughput phase (default 10)")
    p.add_argument("--json", default="", metavar="FILE", help="rank 0 writes the results to FILE")
    p.add_argument("--samples", action="store_true", help="include per-step samples in the JSON")
    p.add_argument("--max-strategy-s", type=float, default=30, help="cap on one strategy's measuring (default 30)")
    args = p.parse_args(argv)
    try:
        batches = [int(b) for b in args.batches.split(",") if b.strip()]
        if not batches or min(batches) <= 0:
            raise ValueError("--batches must list positive batches")
        if args.steps <= 0 or args.warmup < 0 or args.throughput_batch <= 0:
            raise ValueError("--steps and --throughput-batch must be positive, --warmup not negative")
        if not args.allreduce_only and not args.weights:
            raise ValueError("--weights is needed (or --allreduce-only)")
        names = [] if args.allreduce_only else common.select_strategies(args.system, FLOORS, ORDER, "pytorch")
    except ValueError as e:
        p.error(str(e))

    world = int(os.environ.get("WORLD_SIZE", "1")) if "RANK" in os.environ else 1
    rank0 = "RANK" not in os.environ or os.environ["RANK"] == "0"
    doc = {"system": "pytorch", "device": None, "versions": {}, "workload": "gpt2-decode",
           "shape": {"name": "gpt2-decode", "tensor_parallel": world, "batches": batches},
           "dtype": "float32", "steps": args.steps, "warmup": args.warmup, "batch": args.throughput_batch,
           "launch": "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else ("environment" if world > 1 else "single process"),
           "nccl_env": {k: os.environ.get(k) for k in NCCL_ENV},
           "timing": {"alignment": "before each measured step and each batch every rank waits for a barrier "
                                   "(a one-element all-reduce, synchronized); times are rank 0's, every rank's under ranks"},
           "results": [], "allreduce": []}
    if rank0:
        common.write_json(args.json, doc)
    try:
        import numpy as np
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False: no GPU visible to PyTorch")
        torch.set_float32_matmul_precision("highest")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        ranks = torch_dp.Ranks(torch)
        doc["device"] = torch_dp.device_info(torch, ranks.local)
        doc["versions"] = {"torch": torch.__version__, "cuda": torch.version.cuda, "numpy": np.__version__,
                           "nccl": torch_dp.nccl_version(torch) if ranks.dist else None}
        weights, meta = gpt2_data.read_safetensors(args.weights) if args.weights else ({}, {})
        if args.allreduce_only and weights:
            shape = gpt2_data.Config(weights, meta, 1, args.heads, args.pos, args.seed)
            args.width, args.layers = shape.d, shape.layers
        cfgs = [] if args.allreduce_only else [gpt2_data.Config(weights, meta, b, args.heads, args.pos, args.seed)
                                               for b in batches]
        if cfgs:
            doc["shape"]["describe"] = cfgs[0].describe()
            if cfgs[0].heads % world:
                raise ValueError(f"{cfgs[0].heads} heads do not split over {world} ranks")
        checks = [read_check(args.check.replace("{batch}", str(c.batch)), c) if args.check else None for c in cfgs]
        doc["checked_against"] = [ck["file"] for ck in checks if ck]
    except Exception as e:
        if rank0:
            return common.cannot_run(TAG, args.json, doc, e)
        raise
    if ranks.rank == 0:
        common.log(TAG, f"{doc['device']}, torch {torch.__version__}, {world} rank(s), NCCL env {doc['nccl_env']}")

    failures = 0
    for cfg, check in zip(cfgs, checks):
        model = TPModel(torch, cfg, weights, ranks)
        for name in names:
            try:
                res = run_strategy(name, torch, model, ranks, args, check)
            except Exception as e:
                # A rank that fails mid-strategy leaves the others in a
                # collective: the launcher's timeout ends them.
                res = common.failed_result(name, FLOORS[name], e, dtype="float32", rank=ranks.rank, batch=cfg.batch)
                common.log(TAG, f"rank {ranks.rank}: b{cfg.batch} {name} failed: {res['error']}")
            per_rank = ranks.gather(res)
            if per_rank is not None:
                if any("error" in r for r in per_rank):
                    row = dict(per_rank[0])
                    row["error"] = "; ".join(f"rank {r.get('rank')}: {r['error']}" for r in per_rank if "error" in r)
                    failures += 1
                else:
                    row = merge_ranks(per_rank, args.tolerance)
                    failures += row["output_ok"] is False
                doc["results"].append(row)
                common.write_json(args.json, doc)
        del model
    d = cfgs[0].d if cfgs else args.width
    layers = cfgs[0].layers if cfgs else args.layers
    for b in batches if ranks.dist is not None else []:  # one rank: nothing to reduce
        try:
            ar = allreduce_alone(torch, ranks, d, layers, b, args)
        except Exception as e:
            ar = {"batch": b, "error": common.describe_exception(e)}
            failures += 1
        if ranks.rank == 0:
            doc["allreduce"].append(ar)
            common.log(TAG, f"all-reduce of {d} x {b} floats: {ar}")
            common.write_json(args.json, doc)
    ranks.close()
    if ranks.rank != 0:
        return 0
    return common.finish_run(TAG, args.json, doc, failures,
                             f"done: {len(doc['results'])} rows, {len(doc['allreduce'])} all-reduce sizes"
                             + (f"; wrote {args.json}" if args.json else ""))


if __name__ == "__main__":
    sys.exit(main())
