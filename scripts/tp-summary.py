#!/usr/bin/env python3
"""The summary of scripts/gpu-tp: reads DIR (its output) and prints the tables,
the main one last; writes their numbers as JSON.

    tp-summary.py DIR SUMMARY.json "1 8" "1 2 4"

Needs numpy (for comparing the dumps' logits) and bench/peers on PYTHONPATH
(gpt2_data reads the dumps).
"""

from __future__ import annotations

import glob
import json
import os
import sys


def load(p):
    try:
        with open(p) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def p50(v):
    return v.get("p50") if isinstance(v, dict) and v.get("p50") else None


def fmt(v, unit="", nd=1):
    return "-" if v is None else f"{v:.{nd}f}{unit}"


def ratio(a, b):
    return a / b if a and b else None


def logits(path):
    try:
        import numpy as np
        import gpt2_data
        t, _ = gpt2_data.read_safetensors(path)
        return np.asarray(t["logits"], dtype=np.float64)
    except Exception:
        return None


def table(cells):
    w = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
    out = []
    for n, c in enumerate(cells):
        out.append("  ".join(x.ljust(w[i]) if i == 0 else x.rjust(w[i]) for i, x in enumerate(c)))
        if n == 0:
            out.append("  ".join("-" * x for x in w))
    return "\n".join(out)


def main():
    d, out = sys.argv[1], sys.argv[2]
    batches = [int(b) for b in sys.argv[3].split()]
    tps = [int(n) for n in sys.argv[4].split()]
    rows, strat_rows, nccl_rows = [], [], []
    backends = set()
    torch_docs = {n: load(os.path.join(d, f"torch-tp{n}.json")) for n in tps}

    def torch_rows(n, b):
        doc = torch_docs.get(n) or {}
        return {r["strategy"]: r for r in doc.get("results", []) if r.get("batch") == b}

    def nccl_alone(doc, b):
        for a in (doc or {}).get("allreduce", []):
            if a.get("batch") == b:
                return a
        return None

    for n in tps:
        for b in batches:
            cfg = f"tp{n}-b{b}"
            row = {"config": cfg, "tp": n, "batch": b}
            sg = load(os.path.join(d, cfg, "stablegraph.json"))
            if sg:
                backends.add(sg.get("backend"))
                res = {r["strategy"]: r for r in sg.get("results", [])}
                fw = p50(res.get("replay-fixed", {}).get("wall_us"))
                row["floor_wall_us"] = fw
                row["floor_gpu_us"] = p50(res.get("replay-fixed", {}).get("step_us"))
                row["wall_us"] = {s: p50(r.get("wall_us")) for s, r in res.items()}
                ratios = {s: ratio(w, fw) for s, w in row["wall_us"].items()
                          if s not in ("eager", "replay-fixed", "auto") and ratio(w, fw)}
                if ratios:
                    best = min(ratios, key=ratios.get)
                    row["best"], row["best_ratio"], row["best_wall_us"] = best, ratios[best], row["wall_us"][best]
                a = res.get("auto", {})
                if ratio(p50(a.get("wall_us")), fw):
                    row["auto_ratio"] = ratio(p50(a.get("wall_us")), fw)
                    note = a.get("note", "")
                    row["auto_ran"] = note.split(":")[0].replace("ran ", "") if note.startswith("ran ") else "auto"
                ranks = sg.get("ranks") or [sg]
                row["all_match_eager"] = all(r.get("outputs_match_eager") or "not supported" in (r.get("note") or "")
                                             for rk in ranks for r in rk.get("results", []))
                row["collectives_captured_steady"] = sum(
                    int(x.split("collectives captured in steady state: ")[1].split(";")[0])
                    for rk in ranks for r in rk.get("results", [])
                    for x in [r.get("note") or ""] if "collectives captured in steady state: " in x)
                strat_rows.append(row)
            got, ref = logits(os.path.join(d, cfg, "dump.safetensors")), logits(os.path.join(d, f"tp1-b{b}", "dump.safetensors"))
            if got is not None and ref is not None and got.shape == ref.shape:
                row["logits_vs_tp1"] = float(abs(got - ref).max())
            tr = torch_rows(n, b)
            for s, key in (("torch-graph-fixed", "torch_graph_us"), ("torch-eager", "torch_eager_us"),
                           ("torch-graph-swap-copy", "torch_swap_us")):
                row[key] = p50(tr.get(s, {}).get("batch_us"))
            errs = [r.get("max_abs_err_vs_stablegraph") for r in tr.values() if r.get("max_abs_err_vs_stablegraph") is not None]
            row["torch_logits_vs_1gpu"] = max(errs) if errs else None
            row["torch_ok"] = all(r.get("output_ok") for r in tr.values()) if tr else None
            a = nccl_alone(torch_docs.get(n), b)
            if a:
                row["nccl_token_gpu_us"] = p50(a.get("graph_token_us"))
                row["nccl_share_of_floor"] = ratio(row["nccl_token_gpu_us"], row.get("floor_wall_us"))
            rows.append(row)

    for n in tps:
        if n < 2:
            continue
        docs = [("default", torch_docs.get(n))]
        for p in sorted(glob.glob(os.path.join(d, f"nccl-tp{n}-*.json"))):
            doc = load(p)
            env = (doc or {}).get("nccl_env") or {}
            docs.append((" ".join(f"{k}={v}" for k, v in env.items() if v and k in ("NCCL_ALGO", "NCCL_PROTO")) or
                         os.path.basename(p), doc))
        for name, doc in docs:
            for b in batches:
                a = nccl_alone(doc, b)
                if not a:
                    continue
                sym = a.get("symm_one_shot") or {}
                nccl_rows.append({"tp": n, "batch": b, "setting": name, "bytes": a.get("bytes"),
                                  "eager_us": p50(a.get("eager_us")), "graph_one_us": p50(a.get("graph_one_us")),
                                  "graph_token_us": p50(a.get("graph_token_us")), "per_token": a.get("per_token"),
                                  "symm_token_us": p50(sym.get("graph_token_us")), "symm_eager_us": p50(sym.get("eager_us")),
                                  "symm_error": sym.get("error"), "error": a.get("error")})

    simulated = backends - {"cuda"}
    if simulated:
        print(f"NOTE: backend {', '.join(sorted(x for x in backends if x))}: stablegraph's times are simulated, "
              "not GPU measurements")
    # Every strategy against the floor.
    strats = []
    for r in strat_rows:
        for s in r.get("wall_us", {}):
            if s not in strats:
                strats.append(s)
    if strat_rows:
        print("stablegraph, every strategy: wall p50 per token (us; back-to-back batches of 10, caches swapped "
              "between rows every step), and over the floor (replay-fixed)")
        cells = [["config"] + strats]
        for r in strat_rows:
            fw = r.get("floor_wall_us")
            cells.append([r["config"]] + [f"{fmt(r['wall_us'].get(s))} ({fmt(ratio(r['wall_us'].get(s), fw), 'x', 2)})"
                                          if r["wall_us"].get(s) else "-" for s in strats])
        print(table(cells))
        print()
    if nccl_rows:
        print("NCCL's all-reduce alone (GPU p50, us): d x batch floats; eager = one all_reduce launched; graph = one in "
              "a CUDA graph; token = a graph of 2 x layers all-reduces (a token's); one-shot = PyTorch's "
              "symmetric-memory one-shot all-reduce, a token's in a graph")
        cells = [["TP", "batch", "setting", "bytes", "eager", "graph", "token", "token/AR", "one-shot token"]]
        for r in nccl_rows:
            per = ratio(r["graph_token_us"], r["per_token"])
            sym = fmt(r["symm_token_us"]) if r["symm_token_us"] else ("error" if r.get("symm_error") else "-")
            cells.append([str(r["tp"]), str(r["batch"]), r["setting"], str(r["bytes"]), fmt(r["eager_us"]),
                          fmt(r["graph_one_us"]), fmt(r["graph_token_us"]), fmt(per), sym])
        print(table(cells))
        for r in nccl_rows:
            if r.get("symm_error"):
                print(f"  one-shot at TP {r['tp']} batch {r['batch']} ({r['setting']}): {r['symm_error']}")
                break
        print()
    print("Tensor-parallel GPT-2 small decode: time per token = wall p50 per step (us). ours: stablegraph "
          "(floor = the graph replayed with nothing moving; best and auto with caches swapped every step, over "
          "the floor); torch: the PyTorch TP peer (graph = its floor, swap = static-cache copies). logits: max abs "
          "vs TP 1 (ours, same steps) and vs the single-GPU step (torch). NCCL token: a token's all-reduces alone "
          "in a graph (GPU), and over our floor.")
    cells = [["config", "our floor", "best/floor", "auto/floor", "torch graph", "torch eager", "torch swap",
              "floor/torch", "best/torch swap", "logits vs TP1", "torch logits", "NCCL token", "NCCL/floor",
              "match eager", "colls"]]
    for r in rows:
        cells.append([
            r["config"], fmt(r.get("floor_wall_us")),
            f"{r['best']} {r['best_ratio']:.3f}x" if r.get("best") else "-",
            f"{r.get('auto_ran', 'auto')} {r['auto_ratio']:.3f}x" if r.get("auto_ratio") else "-",
            fmt(r.get("torch_graph_us")), fmt(r.get("torch_eager_us")), fmt(r.get("torch_swap_us")),
            fmt(ratio(r.get("floor_wall_us"), r.get("torch_graph_us")), "x", 2),
            fmt(ratio(r.get("best_wall_us"), r.get("torch_swap_us")), "x", 2),
            "-" if r.get("logits_vs_tp1") is None else f"{r['logits_vs_tp1']:.1e}",
            "-" if r.get("torch_logits_vs_1gpu") is None else f"{r['torch_logits_vs_1gpu']:.1e}",
            fmt(r.get("nccl_token_gpu_us")), fmt(r.get("nccl_share_of_floor"), "", 2),
            {True: "yes", False: "NO", None: "-"}[r.get("all_match_eager")],
            str(r.get("collectives_captured_steady", "-")),
        ])
    print(table(cells))
    with open(out, "w") as f:
        json.dump({"rows": rows, "nccl": nccl_rows, "simulated": sorted(x for x in simulated if x)}, f, indent=2)


if __name__ == "__main__":
    main()
