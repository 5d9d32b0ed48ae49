#!/usr/bin/env python3
"""PyTorch peer of stablegraph's gpt2-decode workload (docs/WORKLOADS.md): one
decode step of GPT-2 over a batch of B sequences, each with its own KV cache.

The same weights (the safetensors file `stablegraph run --workload gpt2-decode
--weights FILE` writes), the same tokens, positions and initial caches
(gpt2_data.py computes them as workload/gpt2.go does), float32 with TF32 off.
As PyTorch users write it (and as the issue's anchor did), the step keeps the
batch's caches in one static tensor [layers, k|v, B, heads, positions, head
dim] and attends over all positions with a mask (t > position), so that every
shape is fixed and the step can be captured in a CUDA graph.

Strategies (every row's floor is torch-graph-fixed):

  torch-graph-fixed       the floor: the step captured once over static
                          tokens, positions, caches and logits, replayed with
                          nothing moving (the rows keep their sequences).
  torch-eager             the step's ops launched one by one, reading the
                          step's tokens and positions from a ring of two
                          input buffers and writing a ring of two logits
                          buffers; the rows keep their sequences.
  torch-graph-copy        the graph, with the step's tokens and positions
                          copied into its static inputs and its logits copied
                          out (both copies count).
  torch-graph-swap-copy   as stablegraph's swap pattern: B + k sequences, each
                          with its own cache tensor; every step k = max(1,
                          B/4) random rows get a sequence that was out of the
                          batch. The graph reads the static batched cache, so
                          each swap copies the outgoing row's cache back to its
                          sequence and the incoming sequence's cache into the
                          row (whole caches: what a static-cache user does),
                          then tokens and positions are copied in, the graph
                          replays, the logits are copied out. Re-capturing
                          instead would not avoid the copies: the batched
                          attention needs the caches in one tensor.
  torch-compile           torch.compile(mode="reduce-overhead") of the step
                          over the static tensors. The step writes its KV
                          cache in place (a mutated input), for which
                          PyTorch skips CUDA graphs; the row says whether it
                          did (cudagraph_skips).

With --check FILE (the dump of `stablegraph run --workload gpt2-decode
--pattern fixed --strategy eager --steps 1 --warmup 0 --dump FILE`), every
strategy runs one more step on the dump's tokens and positions with row r
holding sequence r, and records the max abs difference of its logits from
stablegraph's (max_abs_err_vs_stablegraph; output_ok within --tolerance,
default 1e-3). Without it nothing is checked.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import gpt2_data  # noqa: E402

FIXED = "torch-graph-fixed"
ORDER = [FIXED, "torch-eager", "torch-graph-copy", "torch-graph-swap-copy", "torch-compile"]
FLOORS = {s: FIXED for s in ORDER}
TAG = "torch gpt2"
RING = 2


class Model:
    """The weights on the GPU and the step."""

    def __init__(self, torch, cfg: gpt2_data.Config, weights: dict):
        self.torch = torch
        self.F = torch.nn.functional
        self.cfg = cfg
        dev = torch.device("cuda")

        def put(name):
            return torch.from_numpy(weights[name].copy()).to(device=dev, dtype=torch.float32).contiguous()

        self.wte, self.wpe = put("wte.weight"), put("wpe.weight")
        self.layers = []
        for l in range(cfg.layers):
            p = f"h.{l}."
            self.layers.append({k: put(p + k) for k in (
                "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias")})
        self.lnf_w, self.lnf_b = put("ln_f.weight"), put("ln_f.bias")
        self.rows = torch.arange(cfg.batch, device=dev)
        self.positions = torch.arange(cfg.npos, device=dev)
        self.scale = 1.0 / (cfg.hd ** 0.5)

    def new_cache(self, rows: int):
        """A zeroed batched cache: [layers, 2, rows, heads, positions, head dim]."""
        c = self.cfg
        return self.torch.zeros((c.layers, 2, rows, c.heads, c.npos, c.hd), device="cuda", dtype=self.torch.float32)

    def hidden(self, tokens, pos, kv):
        """The step up to the final layer norm: tokens and pos are int64 [B];
        kv the batched cache (row r's keys at kv[l, 0, r], values at
        kv[l, 1, r]). The new keys and values are written at each row's
        position, then every row attends over all positions with those after
        its own masked."""
        torch, F, c = self.torch, self.F, self.cfg
        B, d, H, hd = c.batch, c.d, c.heads, c.hd
        x = torch.index_select(self.wte, 0, tokens) + torch.index_select(self.wpe, 0, pos)
        mask = (self.positions[None, :] > pos[:, None])[:, None, None, :]  # [B, 1, 1, P]
        for l, w in enumerate(self.layers):
            h = F.layer_norm(x, (d,), w["ln_1.weight"], w["ln_1.bias"], gpt2_data.EPS)
            qkv = torch.addmm(w["attn.c_attn.bias"], h, w["attn.c_attn.weight"])
            q, k, v = qkv.split(d, dim=1)
            kv[l, 0][self.rows, :, pos] = k.reshape(B, H, hd)
            kv[l, 1][self.rows, :, pos] = v.reshape(B, H, hd)
            s = torch.matmul(q.reshape(B, H, 1, hd), kv[l, 0].transpose(-1, -2)) * self.scale  # [B, H, 1, P]
            p = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1)
            a = torch.matmul(p, kv[l, 1]).reshape(B, d)
            x = x + torch.addmm(w["attn.c_proj.bias"], a, w["attn.c_proj.weight"])
            h = F.layer_norm(x, (d,), w["ln_2.weight"], w["ln_2.bias"], gpt2_data.EPS)
            f = F.gelu(torch.addmm(w["mlp.c_fc.bias"], h, w["mlp.c_fc.weight"]), approximate="tanh")
            x = x + torch.addmm(w["mlp.c_proj.bias"], f, w["mlp.c_proj.weight"])
        return F.layer_norm(x, (d,), self.lnf_w, self.lnf_b, gpt2_data.EPS)

    def step(self, tokens, pos, kv, out):
        """One decode step; the logits [B, vocab] (tied LM head) go to out."""
        return self.torch.mm(self.hidden(tokens, pos, kv), self.wte.t(), out=out)

    def forward(self, tokens, pos, kv):
        """The step returning new logits (for torch.compile)."""
        return self.torch.mm(self.hidden(tokens, pos, kv), self.wte.t())

    def new_sequences(self, count: int):
        """The caller's count sequences, each with its cache (Runner's)."""
        return Sequences(self.torch, self, count)


class Sequences:
    """The caller's sequences: each one's own cache tensor [layers, 2, heads,
    positions, head dim] with its initial prefix, and its position."""

    def __init__(self, torch, model: Model, count: int):
        c = model.cfg
        self.caches = []
        for s in range(count):
            t = torch.zeros((c.layers, 2, c.heads, c.npos, c.hd), device="cuda", dtype=torch.float32)
            p = c.seq_pos(s)
            if p:
                pre = gpt2_data.cache_prefix(c, s).reshape(c.layers, 2, p, c.heads, c.hd).transpose(0, 1, 3, 2, 4)
                t[:, :, :, :p, :].copy_(torch.from_numpy(pre.copy()).to(device="cuda", dtype=torch.float32))
            self.caches.append(t)


def int_tensor(torch, values):
    import numpy as np
    return torch.from_numpy(np.asarray(values, dtype=np.int64)).to(device="cuda", dtype=torch.int64)


class Runner:
    """One strategy: step(i) runs step i; check(tokens, positions) runs one
    step with row r holding sequence r and returns the logits."""

    def __init__(self, name, torch, model: Model, args, capture_fn=None):
        self.name, self.torch, self.model = name, torch, model
        capture_fn = capture_fn or capture
        c = model.cfg
        B = c.batch
        self.notes = []
        count = B + c.swaps_per_step() if name == "torch-graph-swap-copy" else B
        self.seqs = model.new_sequences(count)
        self.rows = list(range(B))
        self.idle = list(range(B, count))
        self.kv = model.new_cache(B)
        self.load_rows()
        # Inputs of every step, made before timing: the tokens of each
        # sequence for the steps of a ring (their values do not change the
        # work), and each sequence's position.
        self.tok_ring = [int_tensor(torch, [gpt2_data.token(c, i, s) for s in range(count)]) for i in range(RING)]
        self.pos_all = int_tensor(torch, [c.seq_pos(s) for s in range(count)])
        self.tokens = [int_tensor(torch, [0] * B) for _ in range(RING)]
        self.positions = [int_tensor(torch, [c.seq_pos(s) for s in range(B)]) for _ in range(RING)]
        self.outs = [torch.empty((B, c.vocab), device="cuda", dtype=torch.float32) for _ in range(RING)]
        for i in range(RING):
            self.tokens[i].copy_(self.tok_ring[i][:B])
        self.seq_ids = int_tensor(torch, list(range(count)))
        self.row_map = int_tensor(torch, self.rows)  # swap: the sequence in each row, on the device
        self.st_tok, self.st_pos = self.tokens[0].clone(), self.positions[0].clone()
        self.st_out = torch.empty_like(self.outs[0])
        self.rng = random.Random(c.seed)  # the swap schedule; stablegraph's is its own, with the same k per step
        self.graph = None
        stream = torch.cuda.Stream()
        if name in (FIXED, "torch-graph-copy", "torch-graph-swap-copy"):
            self.graph = capture_fn(torch, lambda: model.step(self.st_tok, self.st_pos, self.kv, self.st_out), stream)
        if name == FIXED:
            self.step = lambda i: self.graph.replay()
            self.out_for = lambda i: self.st_out
            self.addresses = 1
        elif name == "torch-eager":
            self.step = lambda i: model.step(self.tokens[i % RING], self.positions[i % RING], self.kv, self.outs[i % RING])
            self.out_for = lambda i: self.outs[i % RING]
            self.addresses = RING
        elif name == "torch-graph-copy":
            self.step = self._copy_step
            self.out_for = lambda i: self.outs[i % RING]
            self.addresses = RING
        elif name == "torch-graph-swap-copy":
            self.step = self._swap_step
            self.out_for = lambda i: self.outs[i % RING]
            self.addresses = RING
        elif name == "torch-compile":
            self.compiled = torch.compile(model.forward, mode="reduce-overhead")

            def step(i):
                # reduce-overhead's outputs live in its graph's pool until the
                # next call: the caller copies them out at once.
                self.outs[i % RING].copy_(self.compiled(self.tokens[i % RING], self.positions[i % RING], self.kv))
            self.step = step
            self.out_for = lambda i: self.outs[i % RING]
            self.addresses = RING
            for i in range(3):  # compile (and record, when it graphs) before timing
                self.step(i)
        else:
            raise ValueError(f"unknown strategy {name}")
        torch.cuda.synchronize()

    def load_rows(self):
        """Copies each row's sequence cache into the batched cache."""
        for r, s in enumerate(self.rows):
            self.kv[:, :, r].copy_(self.seqs.caches[s])

    def _copy_step(self, i):
        self.st_tok.copy_(self.tokens[i % RING])
        self.st_pos.copy_(self.positions[i % RING])
        self.graph.replay()
        self.outs[i % RING].copy_(self.st_out)

    def _swap_step(self, i):
        """k random rows get the sequences out of the batch: each outgoing
        row's cache is copied back to its sequence (the steps appended to
        it), the incoming one's into the row, and the device's row map is
        updated; the step's tokens and positions are gathered through it."""
        k, slot = len(self.idle), i % RING
        for j, r in enumerate(self.rng.sample(range(len(self.rows)), k)):
            out_seq, in_seq = self.rows[r], self.idle[j]
            self.seqs.caches[out_seq].copy_(self.kv[:, :, r])
            self.kv[:, :, r].copy_(self.seqs.caches[in_seq])
            self.row_map[r].copy_(self.seq_ids[in_seq])
            self.rows[r], self.idle[j] = in_seq, out_seq
        self.torch.index_select(self.tok_ring[slot], 0, self.row_map, out=self.tokens[slot])
        self.torch.index_select(self.pos_all, 0, self.row_map, out=self.positions[slot])
        self._copy_step(i)

    def check(self, tokens, positions):
        """Row r back to sequence r (caches restored from the sequences'
        own), the given tokens and positions, one step: its logits."""
        torch = self.torch
        if self.name == "torch-graph-swap-copy":
            for r, s in enumerate(self.rows):
                self.seqs.caches[s].copy_(self.kv[:, :, r])
            self.rows = list(range(len(self.rows)))
            self.idle = list(range(len(self.rows), len(self.seqs.caches)))
            self.row_map.copy_(int_tensor(torch, self.rows))
            self.load_rows()
        i = RING - 1  # the last ring slot: not the one any graph was captured over
        self.tokens[i].copy_(int_tensor(torch, tokens))
        self.positions[i].copy_(int_tensor(torch, positions))
        if self.name == "torch-graph-swap-copy":
            self._copy_step(i)
        elif self.name == FIXED:
            self.st_tok.copy_(self.tokens[i])
            self.st_pos.copy_(self.positions[i])
            self.graph.replay()
        else:
            self.step(i)
        torch.cuda.synchronize()
        return self.out_for(i)

    def close(self):
        self.graph = None
        self.step = None
        self.kv = None
        self.seqs = None


def capture(torch, fn, stream, warm=3):
    """fn captured into a CUDA graph on a side stream, after warm runs."""
    g = torch.cuda.CUDAGraph()
    cur = torch.cuda.current_stream()
    stream.wait_stream(cur)
    with torch.cuda.stream(stream):
        for _ in range(warm):
            fn()
        stream.synchronize()
        g.capture_begin()
        try:
            fn()
        finally:
            g.capture_end()
    cur.wait_stream(stream)
    return g


def cudagraph_skips(torch):
    """How many times inductor skipped CUDA graphs, when PyTorch says."""
    try:
        from torch._dynamo.utils import counters
        return int(sum(counters["inductor"].get(k, 0) for k in ("cudagraph_skips",)))
    except Exception:
        return None


def run_strategy(name, torch, model, args, check):
    tag = f"{TAG} b{model.cfg.batch} {name}"
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    skips0 = cudagraph_skips(torch)
    runner = Runner(name, torch, model, args)
    try:
        setup_s = time.perf_counter() - t0
        common.log(tag, f"set up in {setup_s:.2f} s; {args.warmup} warm-up + 2 x {args.steps} steps")
        m = common.measure(runner.step, torch.cuda.synchronize, steps=args.steps, warmup=args.warmup,
                           batch=args.throughput_batch, gpu=common.TorchEvents(torch, args.steps),
                           max_seconds=args.max_strategy_s, tag=tag)
        torch.cuda.synchronize()
        res = {"strategy": name, "floor": FLOORS[name], "dtype": "float32"}
        res.update(m.fields(args.samples))
        res["peak_device_bytes"] = int(torch.cuda.max_memory_reserved())
        res["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
        res["input_addresses"] = runner.addresses
        res["setup_s"] = round(setup_s, 4)
        notes = list(m.notes)
        if name == "torch-compile":
            skips1 = cudagraph_skips(torch)
            res["cudagraph_skips"] = None if skips0 is None or skips1 is None else skips1 - skips0
            if res["cudagraph_skips"]:
                notes.append("inductor skipped CUDA graphs (mutated inputs: the KV cache)")
        if name == "torch-graph-swap-copy":
            c = model.cfg
            res["swaps_per_step"] = c.swaps_per_step()
            res["swap_bytes_per_step"] = 2 * c.swaps_per_step() * 4 * c.layers * 2 * c.npos * c.d
        res["max_abs_err_vs_stablegraph"] = None
        res["output_ok"] = None
        if check is not None:
            got = runner.check(check["tokens"], check["positions"]).double().cpu().numpy()
            err = float(abs(got - check["logits"]).max())
            res["max_abs_err_vs_stablegraph"] = err
            res["output_ok"] = err <= args.tolerance
            common.log(tag, f"logits vs stablegraph's eager: max abs difference {err:.3g}")
            if res["output_ok"]:
                notes.insert(0, f"logits vs stablegraph eager: max abs {err:.2g}")
            else:
                notes.insert(0, f"logits differ from stablegraph's eager by {err:.3g} (tolerance {args.tolerance:g})")
        if notes:
            res["note"] = "; ".join(notes)
        return res
    finally:
        runner.close()
        del runner


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", required=True, metavar="FILE",
                   help="the safetensors weights stablegraph wrote (run --workload gpt2-decode --weights FILE)")
    p.add_argument("--batch", type=int, default=8, help="sequences per step, B (default 8)")
    p.add_argument("--heads", type=int, default=None, help="attention heads (default: the weights' metadata, else 12)")
    p.add_argument("--pos", type=int, default=None, help="decode position (default: the weights' metadata, else 128)")
    p.add_argument("--seed", type=int, default=None, help="seed of the inputs (default: the weights' metadata, else 1)")
    p.add_argument("--check", default="", metavar="FILE", help="stablegraph's eager dump to compare logits with")
    p.add_argument("--tolerance", type=float, default=1e-3, help="max abs logits difference allowed (default 1e-3)")
    p.add_argument("--system", default="all", help="comma-separated strategies or 'all' (%s)" % ", ".join(ORDER))
    p.add_argument("--steps", type=int, default=200, help="measured steps per phase (default 200)")
    p.add_argument("--warmup", type=int, default=20, help="warm-up steps (default 20)")
    p.add_argument("--throughput-batch", type=int, default=20, help="steps per batch in the throughput phase (default 20)")
    p.add_argument("--json", default="", metavar="FILE", help="write the results to FILE")
    p.add_argument("--samples", action="store_true", help="include per-step samples in the JSON")
    p.add_argument("--time-limit", type=float, default=0, help="seconds for the whole run; later strategies are skipped (0: none)")
    p.add_argument("--max-strategy-s", type=float, default=60, help="cap on one strategy's measuring (default 60)")
    args = p.parse_args(argv)
    deadline = time.monotonic() + args.time_limit if args.time_limit > 0 else None
    try:
        if args.steps <= 0 or args.warmup < 0 or args.throughput_batch <= 0 or args.batch <= 0:
            raise ValueError("--steps, --throughput-batch and --batch must be positive, --warmup not negative")
        names = common.select_strategies(args.system, FLOORS, ORDER, "pytorch")
    except ValueError as e:
        p.error(str(e))
    spec = {"name": "gpt2-decode", "kind": "gpt2-decode", "batch": args.batch}
    doc = {"system": "pytorch", "device": None, "versions": {}, "workload": "gpt2-decode",
           "shape": spec, "dtype": "float32", "steps": args.steps, "warmup": args.warmup,
           "batch": args.throughput_batch,
           "movement": "tokens, positions and logits in a ring of 2 buffers; caches in one static batched "
                       "tensor (torch-graph-swap-copy: swapped rows' caches copied in and out)",
           "results": []}
    common.write_json(args.json, doc)
    try:
        import numpy as np
        import torch
        weights, meta = gpt2_data.read_safetensors(args.weights)
        cfg = gpt2_data.Config(weights, meta, args.batch, args.heads, args.pos, args.seed)
        doc["shape"] = {"name": "gpt2-decode", "describe": cfg.describe(), "seed": cfg.seed}
        check = None
        if args.check:
            dump, dmeta = gpt2_data.read_safetensors(args.check)
            logits = np.asarray(dump["logits"], dtype=np.float64)
            if logits.shape != (cfg.batch, cfg.vocab) or list(dump["sequences"]) != list(range(cfg.batch)):
                raise ValueError(f"{args.check}: logits {logits.shape} or rows {list(dump['sequences'])} are not "
                                 f"a fixed-pattern step of batch {cfg.batch} (run with --pattern fixed)")
            check = {"tokens": [int(t) for t in dump["tokens"]], "positions": [int(t) for t in dump["positions"]],
                     "logits": logits}
            doc["checked_against"] = {"file": args.check, "metadata": dmeta}
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False: no GPU visible to PyTorch")
        torch.set_float32_matmul_precision("highest")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.cuda.init()
        props = torch.cuda.get_device_properties(0)
        doc["device"] = f"{props.name} ({props.multi_processor_count} SMs, cc {props.major}.{props.minor})"
        doc["versions"] = {"torch": torch.__version__, "cuda": torch.version.cuda, "numpy": np.__version__,
                           "float32_matmul_precision": torch.get_float32_matmul_precision()}
        model = Model(torch, cfg, weights)
        common.log(TAG, f"{doc['device']}: {cfg.describe()}")
    except Exception as e:
        return common.cannot_run(TAG, args.json, doc, e)

    failures = 0
    for name in names:
        if deadline is not None and time.monotonic() > deadline:
            res = common.skipped_result(name, FLOORS[name], "time limit reached", dtype="float32")
        else:
            try:
                res = run_strategy(name, torch, model, args, check)
            except Exception as e:
                res = common.failed_result(name, FLOORS[name], e, dtype="float32")
                common.log(TAG, f"{name} failed: {res['error']}")
        if "error" in res or res.get("output_ok") is False:
            failures += 1
        doc["results"].append(res)
        common.write_json(args.json, doc)
    return common.finish_run(TAG, args.json, doc, failures,
                             f"done: {len(names) - failures} of {len(names)} strategies measured and matching")


if __name__ == "__main__":
    sys.exit(main())
