#!/usr/bin/env python3
"""The GPU check of `stablegraph generate` (issue 28, docs/GENERATE.md).

One command (scripts/gpu-generate runs it) that, on a GPU machine with
PyTorch and transformers and no network:

1. makes random-initialised GPT-2-small weights with transformers (fixed
   seed), saved as transformers saves them (model.safetensors with the
   "transformer." prefix, config.json);
2. runs `stablegraph generate` greedy on prompts of different lengths, 32 new
   tokens each, at --rows 1, 4 and 16 with more prompts than rows (sequences
   join and leave), and compares every sequence's token ids with
   transformers' own `generate` (greedy, eager, float32, TF32 off) token for
   token; a divergence passes only at a near-tie (the top-2 logits within
   1e-4, shown);
3. measures continuous batching, 64 prompts through 16 rows, against a
   hand-written vLLM-style PyTorch loop (VllmStylePeer below: one static
   batched KV-cache tensor, a CUDA graph captured per batch size, copies on
   join and leave) and transformers' generate: tokens/s, TTFT and TPOT
   p50/p90, graphs, capture or start-up time, memory;
4. measures sampling on the device (the default) against the host
   (--host-sampling), temperature alone, top-k and top-p, 64 prompts through
   16 rows and at B=1: tokens/s, TPOT, bytes read back a token, where each
   token was drawn; and checks that both give the same tokens;
5. writes everything under --out and prints a summary table last.

`run --dry-run` runs the script's own steps on sim with generate's tiny
random model and no PyTorch (greedy at 1, 4, 16 rows against B=1, the
sampling runs device against host): a check of the script, no GPU figures.

Our prompts are tokenized by stablegraph (its JSON holds the ids); the peers
take those ids, so the comparison is of the models, not of two tokenizers.

`peer` alone runs the vLLM-style loop on the CPU without CUDA graphs (torch
only, any version): a smoke test of its model against stablegraph's tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

NEAR_TIE = 1e-4
EOS = 50256
EPS = 1e-5

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly "
         "hex every jovial zebra near an old stone bridge under the morning sun").split()


def prompts(n: int, seed: int = 0) -> list[str]:
    """n prompts of different lengths (1 to about 120 words), deterministic."""
    out = []
    for i in range(n):
        length = 1 + (i * 37 + seed) % 120
        out.append(" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(length)).capitalize())
    return out


def quantile(v, q):
    if not v:
        return None
    v = sorted(v)
    k = max(0, min(len(v) - 1, int(-(-q * len(v) // 1)) - 1))
    return v[k]


# ---------------------------------------------------------------- comparison


def compare(ours: list, hf: list) -> dict:
    """Token-for-token comparison of our sequences with transformers'.

    ours: our JSON's sequences; hf: per sequence {"tokens", "gaps"} with the
    end-of-text token, when generated, removed and "eos" set. A divergence
    passes when either side's top-2 gap there is below NEAR_TIE."""
    rows, ok = [], True
    for i, (o, h) in enumerate(zip(ours, hf)):
        a, b = o["tokens"], h["tokens"]
        j = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), None)
        row = {"seq": i, "prompt_tokens": len(o["prompt_tokens"]), "ours": len(a), "hf": len(b)}
        if j is None:
            same_end = len(a) == len(b) and (o["stop_reason"] == "stop_token") == h["eos"]
            row["status"] = "equal" if same_end else "length differs"
            ok = ok and same_end
        else:
            og = o["top2_gaps"][j] if j < len(o["top2_gaps"]) else None
            hg = h["gaps"][j]
            tie = (og is not None and 0 <= og < NEAR_TIE) or hg < NEAR_TIE
            row.update(status="near-tie" if tie else "DIVERGES", at=j, our_gap=og, hf_gap=hg,
                       our_token=a[j], hf_token=b[j])
            ok = ok and tie
        rows.append(row)
    return {"ok": ok, "sequences": rows}


# ---------------------------------------------------------------- weights


def load_weights(torch, model_dir: str, device):
    """The checkpoint's tensors (numpy reader), without the prefix."""
    import gpt2_data

    w, _ = gpt2_data.read_safetensors(os.path.join(model_dir, "model.safetensors"))
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    out = {}
    for k, v in w.items():
        k = k.removeprefix("transformer.")
        if k.startswith("lm_head") or k.endswith(".attn.bias") or k.endswith(".attn.masked_bias"):
            continue
        out[k] = torch.from_numpy(v.astype("float32")).to(device)
    return out, cfg


class VllmStylePeer:
    """A vLLM-style decode loop in plain PyTorch: one static batched KV cache
    [layers, k|v, rows, heads, positions, head dim]; a sequence takes a slot
    (prefill, eager, writes its keys and values into the slot: the copy on
    join), the live slots are kept contiguous (when a sequence leaves, the
    last slot's cache is copied into its place: the copy on leave), and each
    decode step replays the CUDA graph captured for the smallest capture size
    holding the live slots (vLLM pads the batch up to it). Greedy, in graph."""

    def __init__(self, torch, weights: dict, cfg: dict, rows: int, positions: int, device, sizes=None):
        self.torch, self.F, self.dev = torch, torch.nn.functional, device
        self.w = weights
        self.L, self.d, self.H = cfg["n_layer"], cfg["n_embd"], cfg["n_head"]
        self.hd = self.d // self.H
        self.eps = cfg.get("layer_norm_epsilon", EPS)
        self.rows, self.P = rows, positions
        self.sizes = sizes or [s for s in (1, 2, 4, 8, 16, 24, 32, 48, 64) if s < rows] + [rows]
        t = torch
        self.kv = t.zeros((self.L, 2, rows, self.H, positions, self.hd), device=device)
        self.tok = t.zeros(rows, dtype=t.long, device=device)
        self.pos = t.zeros(rows, dtype=t.long, device=device)
        self.next = t.zeros(rows, dtype=t.long, device=device)
        self.gap = t.zeros(rows, device=device)
        self.arange = t.arange(rows, device=device)
        self.parange = t.arange(positions, device=device)
        self.graphs, self.capture_s = {}, 0.0
        self.copies = 0

    def ln(self, x, name):
        return self.F.layer_norm(x, (self.d,), self.w[name + ".weight"], self.w[name + ".bias"], self.eps)

    def lin(self, x, name):
        return self.torch.addmm(self.w[name + ".bias"], x, self.w[name + ".weight"])

    def head(self, x):
        logits = self.torch.mm(self.ln(x, "ln_f"), self.w["wte.weight"].t())
        top = self.torch.topk(logits, 2, dim=-1)
        return top.indices[:, 0], top.values[:, 0] - top.values[:, 1]

    def decode(self, n):
        """One step over slots 0..n-1 (static tensors in, next/gap out)."""
        t, F, d, H, hd = self.torch, self.F, self.d, self.H, self.hd
        tok, pos, ar = self.tok[:n], self.pos[:n], self.arange[:n]
        x = self.w["wte.weight"][tok] + self.w["wpe.weight"][pos]
        mask = (self.parange[None, :] > pos[:, None])[:, None, None, :]
        for l in range(self.L):
            p = f"h.{l}."
            q, k, v = self.lin(self.ln(x, p + "ln_1"), p + "attn.c_attn").split(d, dim=1)
            self.kv[l, 0][ar, :, pos] = k.reshape(n, H, hd)
            self.kv[l, 1][ar, :, pos] = v.reshape(n, H, hd)
            s = t.matmul(q.reshape(n, H, 1, hd), self.kv[l, 0, :n].transpose(-1, -2)) / (hd ** 0.5)
            a = t.matmul(t.softmax(s.masked_fill(mask, float("-inf")), dim=-1), self.kv[l, 1, :n]).reshape(n, d)
            x = x + self.lin(a, p + "attn.c_proj")
            f = F.gelu(self.lin(self.ln(x, p + "ln_2"), p + "mlp.c_fc"), approximate="tanh")
            x = x + self.lin(f, p + "mlp.c_proj")
        nxt, gap = self.head(x)
        self.next[:n].copy_(nxt)
        self.gap[:n].copy_(gap)

    def prefill(self, slot, ids):
        """The prompt, eager, causal, into the slot's cache; its first token."""
        t, F, d, H, hd = self.torch, self.F, self.d, self.H, self.hd
        T = len(ids)
        idx = t.tensor(ids, dtype=t.long, device=self.dev)
        x = self.w["wte.weight"][idx] + self.w["wpe.weight"][:T]
        causal = t.ones((T, T), dtype=t.bool, device=self.dev).triu(1)
        for l in range(self.L):
            p = f"h.{l}."
            q, k, v = self.lin(self.ln(x, p + "ln_1"), p + "attn.c_attn").split(d, dim=1)
            q, k, v = (z.reshape(T, H, hd).transpose(0, 1) for z in (q, k, v))
            self.kv[l, 0, slot, :, :T] = k
            self.kv[l, 1, slot, :, :T] = v
            s = t.matmul(q, k.transpose(-1, -2)) / (hd ** 0.5)
            a = t.matmul(t.softmax(s.masked_fill(causal, float("-inf")), dim=-1), v).transpose(0, 1).reshape(T, d)
            x = x + self.lin(a, p + "attn.c_proj")
            f = F.gelu(self.lin(self.ln(x, p + "ln_2"), p + "mlp.c_fc"), approximate="tanh")
            x = x + self.lin(f, p + "mlp.c_proj")
        nxt, gap = self.head(x[-1:])
        return int(nxt[0]), float(gap[0])

    def capture(self):
        """A graph per capture size, as vLLM captures at start-up."""
        t = self.torch
        if self.dev.type != "cuda":
            return
        start = time.perf_counter()
        pool = t.cuda.graph_pool_handle()
        s = t.cuda.Stream()
        s.wait_stream(t.cuda.current_stream())
        with t.cuda.stream(s):
            for n in self.sizes:
                for _ in range(2):
                    self.decode(n)
        t.cuda.current_stream().wait_stream(s)
        for n in reversed(self.sizes):
            g = t.cuda.CUDAGraph()
            with t.cuda.graph(g, pool=pool):
                self.decode(n)
            self.graphs[n] = g
        t.cuda.synchronize()
        self.capture_s = time.perf_counter() - start

    def step(self, n):
        size = next(s for s in self.sizes if s >= n)
        if size in self.graphs:
            self.graphs[size].replay()
        else:
            self.decode(size)

    def move(self, src, dst):
        """Copies slot src's cache into slot dst (a sequence moves down)."""
        self.kv[:, :, dst].copy_(self.kv[:, :, src])
        self.copies += 1

    def generate(self, reqs, max_new):
        """Continuous batching of reqs (token id lists), greedy, up to
        max_new tokens each, stopping at the end of text. Returns per
        sequence {"tokens", "gaps", "eos", "ttft_ms", "tpot_ms"} and the
        wall time."""
        t = self.torch
        sync = t.cuda.synchronize if self.dev.type == "cuda" else (lambda: None)
        res = [{"tokens": [], "gaps": [], "eos": False, "times": []} for _ in reqs]
        live = []  # sequence index per slot
        waiting = list(range(len(reqs)))
        start = time.perf_counter()

        def emit(i, tok, gap):
            r = res[i]
            if tok == EOS:
                r["eos"] = True
                return True
            r["tokens"].append(tok)
            r["gaps"].append(gap)
            r["times"].append(time.perf_counter() - start)
            return len(r["tokens"]) >= max_new

        last = {}
        while waiting or live:
            while waiting and len(live) < self.rows:
                i = waiting.pop(0)
                slot = len(live)
                tok, gap = self.prefill(slot, reqs[i])
                sync()
                if emit(i, tok, gap):
                    continue
                live.append(i)
                last[i] = tok
            if not live:
                continue
            n = len(live)
            self.tok[:n].copy_(t.tensor([last[i] for i in live], device=self.dev))
            self.pos[:n].copy_(t.tensor([len(reqs[i]) + len(res[i]["tokens"]) - 1 for i in live], device=self.dev))
            self.step(n)
            nxt, gap = self.next[:n].tolist(), self.gap[:n].tolist()
            done = []
            for s, i in enumerate(live):
                last[i] = nxt[s]
                if emit(i, nxt[s], gap[s]):
                    done.append(s)
            for s in reversed(done):  # keep the live slots contiguous
                end = len(live) - 1
                if s != end:
                    self.move(end, s)
                    live[s] = live[end]
                live.pop()
        sync()
        wall = time.perf_counter() - start
        for r in res:
            tm = r.pop("times")
            r["ttft_ms"] = 1e3 * tm[0] if tm else None
            r["tpot_ms"] = 1e3 * (tm[-1] - tm[0]) / (len(tm) - 1) if len(tm) > 1 else None
        return res, wall


def summarize(name, res, wall, extra=None):
    toks = sum(len(r["tokens"]) for r in res)
    ttft = [r["ttft_ms"] for r in res if r.get("ttft_ms") is not None]
    tpot = [r["tpot_ms"] for r in res if r.get("tpot_ms") is not None]
    row = {"name": name, "sequences": len(res), "tokens": toks, "seconds": wall,
           "tokens_per_s": toks / wall if wall else None,
           "ttft_p50_ms": quantile(ttft, 0.5), "ttft_p90_ms": quantile(ttft, 0.9),
           "tpot_p50_ms": quantile(tpot, 0.5), "tpot_p90_ms": quantile(tpot, 0.9)}
    row.update(extra or {})
    return row


def ours_row(name, doc):
    s = doc["summary"]
    return {"name": name, "sequences": s["sequences"], "tokens": s["tokens"], "seconds": s["seconds"],
            "tokens_per_s": s["tokens_per_s"], "ttft_p50_ms": s["ttft_p50_ms"], "ttft_p90_ms": s["ttft_p90_ms"],
            "tpot_p50_ms": s["tpot_p50_ms"], "tpot_p90_ms": s["tpot_p90_ms"], "graphs": s["graphs_recorded"],
            "step_programs": s["graphs"], "rerecords": s["rerecords"], "startup_s": s["startup_ms"] / 1e3,
            "process_s": doc.get("process_s"), "memory_mib": s["device_bytes"] / 2**20, "strategy": s["strategy"],
            "patched_nodes": s["patched_nodes"], "mean_active_rows": s["mean_active_rows"],
            "readback_per_token": s.get("readback_bytes", 0) / max(s["tokens"], 1),
            "draws": {k: s.get(k, 0) for k in ("device_draws", "candidate_draws", "fallbacks", "host_draws")}}


# ---------------------------------------------------------------- sampling

# Sampling settings measured on the device (the default) and on the host
# (--host-sampling): temperature alone is drawn on the device (4 bytes back a
# row); top-k 50 from the device's 64 candidates; top-p 0.95 on these
# random-initialised weights, whose nucleus spans most of the vocabulary,
# falls back to reading the row (the fallback's cost, 16 rows only).
SAMPLING = (
    ("T=0.8", ["--temperature", "0.8", "--seed", "1"], True),
    ("T=0.8 top-k 50", ["--temperature", "0.8", "--top-k", "50", "--seed", "2"], True),
    ("T=0.8 top-p 0.95", ["--temperature", "0.8", "--top-p", "0.95", "--seed", "3"], False),
)


def run_sampling(args, perf_file, b1_file, rows, max_new):
    """Each SAMPLING setting drawn on the device and on the host, through
    `rows` rows and at B=1: the rows of the table, and per setting whether
    the device's tokens equal the host's (the same seed draws the same
    tokens, by construction: docs/GENERATE.md)."""
    table, same = [], {}
    for label, flags, b1 in SAMPLING:
        runs = [(perf_file, rows, f"{rows} rows")] + ([(b1_file, 1, "B=1")] if b1 else [])
        for pf, r, where in runs:
            docs = {}
            for side, extra in (("device", []), ("host", ["--host-sampling"])):
                name = f"sample-{label}-{where}-{side}".replace(" ", "_").replace("=", "")
                try:
                    docs[side] = run_ours(args, name, pf, r, flags + extra, max_new)
                    row = ours_row(f"{label}, {where}, {side}", docs[side])
                except Exception as e:
                    row = {"name": f"{label}, {where}, {side}", "error": str(e)[-500:]}
                table.append(row)
            if len(docs) == 2:
                a, b = docs["device"]["sequences"], docs["host"]["sequences"]
                diff = [i for i, (x, y) in enumerate(zip(a, b)) if x["tokens"] != y["tokens"]]
                same[f"{label}, {where}"] = {"ok": not diff and len(a) == len(b), "differ": diff}
            else:
                same[f"{label}, {where}"] = {"ok": False, "differ": "a run failed"}
    return table, same


def sampling_table(table, same) -> str:
    lines = ["", "== sampling on the device (default) against the host (--host-sampling)",
             f"{'run':40} {'tok/s':>8} {'TPOT p50':>9} {'p90':>7} {'B back/tok':>10}  draws: device/candidates/fallback/host"]
    for r in table:
        if "error" in r:
            lines.append(f"{r['name'][:40]:40} error: {r['error'][:80]}")
            continue
        d = r["draws"]
        lines.append(f"{r['name'][:40]:40} {r['tokens_per_s']:8.1f} {r['tpot_p50_ms']:9.3f} {r['tpot_p90_ms']:7.3f} "
                     f"{r['readback_per_token']:10.0f}  {d['device_draws']}/{d['candidate_draws']}/{d['fallbacks']}/{d['host_draws']}")
    for k, v in same.items():
        lines.append(f"tokens device == host, {k}: {'OK' if v['ok'] else 'FAIL ' + str(v['differ'])}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the run


def run_ours(args, name, prompts_file, rows, extra=(), max_new=32):
    path = os.path.join(args.work, f"ours-{name}.json")
    weights = ["--weights", args.model] if args.model else []  # none: generate's tiny random model
    cmd = [args.sg, "--backend", args.backend, "generate", *weights, "--prompts", prompts_file,
           "--max-new-tokens", str(max_new), "--rows", str(rows), "--json", path, *extra]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    with open(os.path.join(args.out, "ours-stderr.log"), "a") as f:
        f.write(f"$ {' '.join(cmd)}\n{p.stderr}\n")
    if p.returncode != 0:
        raise RuntimeError(f"stablegraph generate {name}: exit {p.returncode}: {p.stderr[-2000:]}")
    with open(path) as f:
        doc = json.load(f)
    doc["process_s"] = time.perf_counter() - t0
    return doc


def make_model(args, torch, transformers):
    torch.manual_seed(args.seed)
    cfg = transformers.GPT2Config()  # GPT-2 small
    model = transformers.GPT2LMHeadModel(cfg).eval()
    try:
        model.save_pretrained(args.model, safe_serialization=True)
    except TypeError:  # transformers 5 always writes safetensors
        model.save_pretrained(args.model)
    return model


def hf_generate(torch, model, reqs, max_new):
    """transformers' greedy generate, one prompt at a time (no padding),
    with each step's logits for the top-2 gaps."""
    out = []
    for ids in reqs:
        inp = torch.tensor([ids], device="cuda")
        g = model.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=max_new, do_sample=False,
                           num_beams=1, eos_token_id=EOS, pad_token_id=EOS, output_logits=True,
                           return_dict_in_generate=True)
        toks = g.sequences[0, len(ids):].tolist()
        gaps = []
        for lg in g.logits:
            v = torch.topk(lg[0].float(), 2).values
            gaps.append(float(v[0] - v[1]))
        eos = bool(toks) and toks[-1] == EOS
        if eos:
            toks = toks[:-1]
        out.append({"tokens": toks, "gaps": gaps, "eos": eos})
    return out


def hf_throughput(torch, model, reqs, max_new, batch, static):
    """transformers' generate over reqs in batches (left padding): tokens/s
    of the batch as a whole; TTFT and TPOT are not observable per token
    here, so only the batch's mean time per step is given."""
    t0 = time.perf_counter()
    toks = 0
    for b0 in range(0, len(reqs), batch):
        group = reqs[b0:b0 + batch]
        T = max(len(r) for r in group)
        ids = torch.full((len(group), T), EOS, dtype=torch.long, device="cuda")
        mask = torch.zeros((len(group), T), dtype=torch.long, device="cuda")
        for i, r in enumerate(group):
            ids[i, T - len(r):] = torch.tensor(r, device="cuda")
            mask[i, T - len(r):] = 1
        kw = {"cache_implementation": "static"} if static else {}
        g = model.generate(ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False, num_beams=1,
                           eos_token_id=EOS, pad_token_id=EOS, **kw)
        new = g[:, T:]
        for row in new.tolist():
            toks += next((k for k, x in enumerate(row) if x == EOS), len(row))
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return {"tokens": toks, "seconds": wall, "tokens_per_s": toks / wall}


def cmd_run(args):
    import torch
    import transformers

    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    args.model = os.path.join(args.work, "model")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    report = {"torch": torch.__version__, "transformers": transformers.__version__,
              "device": torch.cuda.get_device_name(0), "near_tie": NEAR_TIE}
    t0 = time.perf_counter()
    model = make_model(args, torch, transformers)
    report["model"] = f"GPT-2 small, random init (torch.manual_seed({args.seed})), saved by transformers"
    check_file = os.path.join(args.work, "check-prompts.txt")
    with open(check_file, "w") as f:
        f.write("\n".join(prompts(args.check_prompts)) + "\n")
    perf_file = os.path.join(args.work, "perf-prompts.txt")
    with open(perf_file, "w") as f:
        f.write("\n".join(prompts(64, seed=11)) + "\n")
    b1_file = os.path.join(args.work, "b1-prompts.txt")
    with open(b1_file, "w") as f:
        f.write("\n".join(prompts(8, seed=5)) + "\n")

    # 1. Token for token against transformers.
    checks = {}
    ours_check = {}
    for rows in (1, 4, 16):
        ours_check[rows] = run_ours(args, f"check-b{rows}", check_file, rows)
    reqs = [s["prompt_tokens"] for s in ours_check[1]["sequences"]]
    model = model.cuda()
    hf = hf_generate(torch, model, reqs, 32)
    for rows, doc in ours_check.items():
        checks[f"B={rows}"] = compare(doc["sequences"], hf)
    report["check"] = checks
    log(f"check done in {time.perf_counter() - t0:.0f} s: " +
        ", ".join(f"{k} {'ok' if v['ok'] else 'FAILED'}" for k, v in checks.items()))
    write(args, "check.json", report)

    # 2. Performance: 64 prompts through 16 rows, and 8 prompts at B=1.
    perf = []
    perf_reqs = None
    for name, extra in (("masked-auto", []), ("masked-device", ["--strategy", "device"]),
                        ("buckets-1-2-4-8-16", ["--buckets", "1,2,4,8,16"]), ("masked-host-argmax", ["--host-argmax"])):
        try:
            doc = run_ours(args, f"perf-{name}", perf_file, 16, extra)
            perf.append(ours_row(f"stablegraph {name} (64 prompts, 16 rows)", doc))
            perf_reqs = perf_reqs or [s["prompt_tokens"] for s in doc["sequences"]]
        except Exception as e:  # keep the rest
            perf.append({"name": f"stablegraph {name}", "error": str(e)[-500:]})
    b1 = None
    try:
        b1 = run_ours(args, "b1", b1_file, 1)
        perf.append(ours_row("stablegraph B=1 (8 prompts)", b1))
    except Exception as e:
        perf.append({"name": "stablegraph B=1", "error": str(e)[-500:]})
    write(args, "perf.json", {"rows": perf})
    samp, same = run_sampling(args, perf_file, b1_file, 16, 32)
    write(args, "sampling.json", {"rows": samp, "device_equals_host": same})

    weights, cfg = load_weights(torch, args.model, torch.device("cuda"))
    if perf_reqs:
        P = max(len(r) for r in perf_reqs) + 32
        runs = [(16, perf_reqs, "64 prompts, 16 rows")]
        if b1:
            runs.append((1, [s["prompt_tokens"] for s in b1["sequences"]], "B=1 (8 prompts)"))
        for rows, rq, label in runs:
            torch.cuda.reset_peak_memory_stats()
            t1 = time.perf_counter()
            peer = VllmStylePeer(torch, weights, cfg, rows, P, torch.device("cuda"))
            peer.capture()
            startup = time.perf_counter() - t1
            res, wall = peer.generate(rq, 32)
            perf.append(summarize(f"torch vLLM-style {label}", res, wall, {
                "graphs": len(peer.graphs), "capture_s": peer.capture_s, "startup_s": startup, "cache_copies": peer.copies,
                "memory_mib": torch.cuda.max_memory_allocated() / 2**20}))
            if rows == 16:
                ref = hf_generate(torch, model, rq[:8], 32)
                perf[-1]["tokens_equal_hf_first8"] = compare([{"tokens": r["tokens"], "top2_gaps": r["gaps"],
                                                               "prompt_tokens": q, "stop_reason": "stop_token" if r["eos"] else "budget"}
                                                              for r, q in zip(res[:8], rq[:8])], ref)["ok"]
            del peer
        write(args, "perf.json", {"rows": perf})
        for static in (False, True):
            label = "transformers generate, " + ("static cache" if static else "dynamic cache") + ", eager (no torch.compile), batches of 16"
            try:
                perf.append(dict(name=label, **hf_throughput(torch, model, perf_reqs, 32, 16, static)))
            except Exception as e:
                perf.append({"name": label, "error": str(e)[-300:]})
        write(args, "perf.json", {"rows": perf})
    report["seconds"] = time.perf_counter() - t0
    write(args, "check.json", report)
    table = summary_table(checks, perf) + sampling_table(samp, same)
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write(table)
    print(table)
    return 0 if all(v["ok"] for v in checks.values()) and all(v["ok"] for v in same.values()) else 1


def cmd_dry_run(args):
    """The run's own steps on sim with generate's tiny random model and no
    PyTorch: greedy at 1, 4 and 16 rows against B=1 (ours against ours), the
    sampling runs device against host, the tables. Times are the
    simulator's, not a GPU's."""
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    args.model, args.backend = None, "sim"
    check_file = os.path.join(args.work, "check-prompts.txt")
    with open(check_file, "w") as f:
        f.write("\n".join(prompts(6)) + "\n")
    b1_file = os.path.join(args.work, "b1-prompts.txt")
    with open(b1_file, "w") as f:
        f.write("\n".join(prompts(2, seed=5)) + "\n")
    docs = {rows: run_ours(args, f"check-b{rows}", check_file, rows, max_new=4) for rows in (1, 4, 16)}
    ref = [{"tokens": s["tokens"], "gaps": s["top2_gaps"], "eos": s["stop_reason"] == "stop_token"}
           for s in docs[1]["sequences"]]
    checks = {f"B={rows} vs B=1": compare(d["sequences"], ref) for rows, d in docs.items() if rows != 1}
    perf = [ours_row(f"stablegraph greedy {rows} rows (sim)", d) for rows, d in docs.items()]
    samp, same = run_sampling(args, check_file, b1_file, 4, 4)
    write(args, "sampling.json", {"rows": samp, "device_equals_host": same})
    table = "(dry run on sim: the simulator's times on this CPU, not a GPU's)\n" + \
        summary_table(checks, perf, "our B=1 (greedy, 4 new tokens)", "sim") + sampling_table(samp, same)
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write(table)
    print(table)
    return 0 if all(v["ok"] for v in checks.values()) and all(v["ok"] for v in same.values()) else 1


def summary_table(checks, perf, against="transformers generate (greedy, 32 new tokens)",
                  clock="wall clock on this GPU") -> str:
    lines = ["", f"== token for token against {against}"]
    for k, v in checks.items():
        seqs = v["sequences"]
        eq = sum(1 for s in seqs if s["status"] == "equal")
        ties = [s for s in seqs if s["status"] == "near-tie"]
        bad = [s for s in seqs if s["status"] not in ("equal", "near-tie")]
        lines.append(f"{k:6} {'OK' if v['ok'] else 'FAIL'}: {eq}/{len(seqs)} equal, {len(ties)} near-tie, {len(bad)} diverging")
        for s in ties + bad:
            lines.append(f"       seq {s['seq']}: {s['status']} at token {s.get('at')}: ours {s.get('our_token')} "
                         f"(gap {s.get('our_gap')}), hf {s.get('hf_token')} (gap {s.get('hf_gap')})")
    lines.append("")
    lines.append(f"== continuous batching ({clock})")
    hdr = f"{'run':58} {'tok/s':>8} {'TTFT p50':>9} {'p90':>8} {'TPOT p50':>9} {'p90':>7} {'graphs':>6} {'start s':>7} {'MiB':>7}"
    lines.append(hdr)

    def f(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    for r in perf:
        if "error" in r:
            lines.append(f"{r['name'][:58]:58} error: {r['error'][:80]}")
            continue
        start = r.get("startup_s", r.get("capture_s"))
        lines.append(f"{r['name'][:58]:58} {f(r.get('tokens_per_s'), '8.1f')} {f(r.get('ttft_p50_ms'), '9.2f')} "
                     f"{f(r.get('ttft_p90_ms'), '8.2f')} {f(r.get('tpot_p50_ms'), '9.3f')} {f(r.get('tpot_p90_ms'), '7.3f')} "
                     f"{f(r.get('graphs'), '6d')} {f(start, '7.2f')} {f(r.get('memory_mib'), '7.0f')}")
    return "\n".join(lines) + "\n"


def write(args, name, doc):
    with open(os.path.join(args.out, name), "w") as f:
        json.dump(doc, f, indent=2)


def log(msg):
    print(f"gen_check: {msg}", file=sys.stderr, flush=True)


def cmd_peer(args):
    """The vLLM-style loop on our JSON's prompts; its tokens against ours."""
    import torch

    dev = torch.device(args.device)
    with open(args.ours) as f:
        doc = json.load(f)
    reqs = [s["prompt_tokens"] for s in doc["sequences"]]
    weights, cfg = load_weights(torch, args.model, dev)
    P = max(len(r) for r in reqs) + args.max_new
    peer = VllmStylePeer(torch, weights, cfg, args.rows, P, dev)
    peer.capture()
    res, wall = peer.generate(reqs, args.max_new)
    cmp = compare(doc["sequences"], res)
    print(json.dumps({"compare": cmp, "summary": summarize("peer", res, wall, {"copies": peer.copies})}, indent=2))
    return 0 if cmp["ok"] else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="the whole GPU check")
    r.add_argument("--sg", required=True, help="the stablegraph binary")
    r.add_argument("--out", required=True, help="results directory")
    r.add_argument("--work", default="/tmp/gen-check", help="scratch (the model: 500 MB)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--check-prompts", type=int, default=24, help="prompts of the token-for-token check")
    r.add_argument("--dry-run", action="store_true",
                   help="on sim with a tiny random model, without PyTorch: the script's own steps, no GPU figures")
    p = sub.add_parser("peer", help="the vLLM-style loop against our JSON (any device)")
    p.add_argument("--model", required=True)
    p.add_argument("--ours", required=True, help="stablegraph generate --json output (greedy)")
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--max-new", type=int, default=32)
    p.add_argument("--device", default="cpu")
    q = sub.add_parser("prompts", help="print the prompts")
    q.add_argument("--n", type=int, default=24)
    q.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        if args.dry_run:
            return cmd_dry_run(args)
        args.backend = "cuda"
        return cmd_run(args)
    if args.cmd == "peer":
        return cmd_peer(args)
    print("\n".join(prompts(args.n, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
