#!/usr/bin/env python3
"""Merge stablegraph's bench JSON and the peers' JSON (torch_peers.py,
jax_peers.py) into one table per workload and one merged JSON file.

Standard library only.

    merge.py [--out merged.json] [--workload W] PATH...

A PATH is a JSON file or a directory searched recursively for *.json (the
layout bench/compare writes: DIR/<workload>/{stablegraph,stablegraph-fixed,
torch,jax,...}.json). A file's workload is --workload if given, else the name
of its directory when that is a known workload (or gpt2-decode-bN: the
batch-B runs of gpt2-decode; dp-weak-nN and dp-strong-nN: dp on N ranks,
scripts/gpu-multi), else its "workload" field
(up to the first space or parenthesis).

Files are told apart by content:
  - a peer file has "system" ("pytorch" or "jax");
  - anything else with "results" is stablegraph's `bench --json` (report
    package format); it is the nothing-moving run when its "movement" field is
    "fixed" or its file name ends in -fixed.json.

Columns (microseconds, p50 unless marked):
  wall      step_us of the peers: wall per step, synced each step. For
            stablegraph its "wall_us" when present (its own "step_us" is GPU
            time by events, see report/report.go), else empty.
  batch     wall per step over batches of back-to-back steps.
  host      host time of the call that issues the step.
  GPU       CUDA-event time around the step: the peers' gpu_us; stablegraph's
            step_us (or gpu_us if it writes one). Empty for JAX.
  ratio     wall p50 / the floor's wall p50.
  GPU ratio GPU p50 / the floor's GPU p50.
  memory    peak device memory held (peak_device_bytes).

Floors (the same system with nothing moving): each peer row names its floor
("floor"); stablegraph's floor is its "replay-fixed" row when the bench JSON
has one, else the same strategy in the --pattern fixed run (shown as
"<strategy>-fixed").

The merged JSON:
  {"generated_by": "bench/peers/merge.py", "sources": [...], "devices": {...},
   "versions": {...}, "problems": [...],
   "workloads": {"mlp": [{"system", "strategy", "dtype", "step_us",
                 "batch_us", "host_us", "gpu_us", "ratio", "gpu_ratio",
                 "peak_device_bytes", "floor", "note"?, "error"?}, ...], ...}}
where the *_us fields are {"p50": .., "p90": ..} or null and "step_us" is
the wall time described above for every system.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

KNOWN_WORKLOADS = ("mlp", "mlp-large", "train", "chain", "gpt2-decode-b1", "gpt2-decode-b8", "gpt2-decode-b32")
# bench/compare puts gpt2-decode's runs of batch B in gpt2-decode-bB;
# scripts/gpu-multi puts dp's runs on N ranks in dp-weak-nN and dp-strong-nN.
BATCHED_DIR = re.compile(r"gpt2-decode(-tiny)?-b\d+|dp-(weak|strong)-n\d+")
SYSTEM_ORDER = {"stablegraph": 0, "pytorch": 1, "jax": 2}
PEER_SYSTEMS = ("pytorch", "jax")
SG_FLOOR_ROW = "replay-fixed"


# ---------------------------------------------------------------- reading


def find_json(paths):
    """The JSON files under paths (files as given; directories walked),
    sorted within each directory."""
    out = []
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs.sort()
                for f in sorted(files):
                    if f.endswith(".json"):
                        out.append(os.path.join(root, f))
        else:
            out.append(p)
    return out


def load(path):
    """(doc, problem): the parsed JSON object, or None and why not."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        return None, f"{path}: cannot read: {e.strerror or e}"
    except ValueError as e:
        return None, f"{path}: not valid JSON: {e}"
    if not isinstance(doc, dict):
        return None, f"{path}: not a JSON object"
    return doc, None


def classify(doc, path):
    """'peer', 'stablegraph', 'stablegraph-fixed', 'merged' or None."""
    if "workloads" in doc and "generated_by" in doc:
        return "merged"
    if doc.get("system") in PEER_SYSTEMS:
        return "peer"
    if isinstance(doc.get("results"), list):
        stem = os.path.basename(path)[:-len(".json")] if path.endswith(".json") else os.path.basename(path)
        if str(doc.get("movement", "")).lower() == "fixed" or re.search(r"[-_.]fixed$", stem):
            return "stablegraph-fixed"
        return "stablegraph"
    return None


def workload_of(doc, path, override=None):
    if override:
        return override
    parent = os.path.basename(os.path.dirname(os.path.abspath(path)))
    if parent in KNOWN_WORKLOADS or BATCHED_DIR.fullmatch(parent):
        return parent
    w = str(doc.get("workload") or "").strip()
    w = re.split(r"[\s(\[,:;]", w, maxsplit=1)[0] if w else ""
    return w or "unknown"


def pct(v):
    """{"p50", "p90"} from a percentile object, or None when absent or not
    a positive measurement (stablegraph writes zeros for no samples)."""
    if not isinstance(v, dict):
        return None
    p50, p90 = v.get("p50"), v.get("p90")
    if not isinstance(p50, (int, float)) or isinstance(p50, bool) or p50 <= 0:
        return None
    out = {"p50": float(p50)}
    out["p90"] = float(p90) if isinstance(p90, (int, float)) and not isinstance(p90, bool) else None
    return out


def as_bytes(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        return None
    return int(v)


# ---------------------------------------------------------------- rows


def row(system, strategy, *, dtype="float32", step=None, batch=None, host=None, gpu=None,
        peak=None, floor=None, note=None, error=None):
    r = {
        "system": system,
        "strategy": strategy,
        "dtype": dtype or "float32",
        "step_us": step,
        "batch_us": batch,
        "host_us": host,
        "gpu_us": gpu,
        "ratio": None,
        "gpu_ratio": None,
        "peak_device_bytes": peak,
        "floor": floor,
    }
    if note:
        r["note"] = note
    if error:
        r["error"] = error
    return r


def peer_rows(doc):
    system = doc["system"]
    rows = []
    for res in doc.get("results") or []:
        if not isinstance(res, dict) or not res.get("strategy"):
            continue
        rows.append(row(
            system, str(res["strategy"]),
            dtype=res.get("dtype") or doc.get("dtype"),
            step=pct(res.get("step_us")), batch=pct(res.get("batch_us")),
            host=pct(res.get("host_us")), gpu=pct(res.get("gpu_us")),
            peak=as_bytes(res.get("peak_device_bytes")),
            floor=res.get("floor"), note=res.get("note"), error=res.get("error"),
        ))
    return rows


def sg_times(res):
    """(wall, gpu) of a stablegraph result. Its step_us is GPU time by events
    (report/report.go) unless it also writes gpu_us, in which case step_us
    is taken as wall."""
    if "gpu_us" in res:
        return pct(res.get("step_us")), pct(res.get("gpu_us"))
    return pct(res.get("wall_us")), pct(res.get("step_us"))


def sg_note(res):
    notes = []
    if res.get("note"):
        notes.append(str(res["note"]))
    if res.get("outputs_match_eager") is False and res.get("strategy") != "eager":
        notes.append("outputs differ from eager")
    return "; ".join(notes) or None


def sg_rows(doc, fixed_doc):
    """Rows of a stablegraph moving run and (optionally) its --movement fixed
    run, with floors assigned."""
    results = [r for r in doc.get("results") or [] if isinstance(r, dict) and r.get("strategy")] if doc else []
    fixed = [r for r in fixed_doc.get("results") or [] if isinstance(r, dict) and r.get("strategy")] \
        if fixed_doc else []
    fixed_names = {str(r["strategy"]) for r in fixed}
    has_replay_fixed = any(str(r["strategy"]) == SG_FLOOR_ROW for r in results)
    rows = []
    for res in results:
        name = str(res["strategy"])
        if has_replay_fixed:
            floor = SG_FLOOR_ROW
        elif name in fixed_names:
            floor = f"{name}-fixed"
        else:
            floor = None
        wall, gpu = sg_times(res)
        rows.append(row("stablegraph", name, dtype=res.get("dtype"), step=wall, batch=pct(res.get("batch_us")),
                        host=pct(res.get("host_us")), gpu=gpu, peak=as_bytes(res.get("peak_device_bytes")),
                        floor=floor, note=sg_note(res), error=res.get("error")))
    for res in fixed:
        name = f"{res['strategy']}-fixed"
        wall, gpu = sg_times(res)
        rows.append(row("stablegraph", name, dtype=res.get("dtype"), step=wall, batch=pct(res.get("batch_us")),
                        host=pct(res.get("host_us")), gpu=gpu, peak=as_bytes(res.get("peak_device_bytes")),
                        floor=name, note=sg_note(res), error=res.get("error")))
    return rows


def ratio(num, den):
    if not num or not den:
        return None
    a, b = num.get("p50"), den.get("p50")
    if not a or not b:
        return None
    return round(a / b, 4)


def assign_ratios(rows, problems, workload):
    """Fill ratio and gpu_ratio from each row's floor in the same system and
    dtype."""
    index = {}
    for r in rows:
        index.setdefault((r["system"], r["dtype"], r["strategy"]), r)
    for r in rows:
        if not r.get("floor"):
            continue
        f = index.get((r["system"], r["dtype"], r["floor"]))
        if f is None:
            problems.append(f"{workload}: {r['system']} {r['strategy']}: floor {r['floor']} not found")
            continue
        r["ratio"] = ratio(r["step_us"], f["step_us"])
        r["gpu_ratio"] = ratio(r["gpu_us"], f["gpu_us"])


# ---------------------------------------------------------------- merge


def merge(paths, workload_override=None):
    """(merged document, problems)."""
    problems = []
    sources = []
    devices = {}
    versions = {}
    peers = {}  # workload -> [rows]
    sg = {}  # workload -> {"moving": (doc, path), "fixed": (doc, path)}
    files = find_json(paths)
    if not files:
        problems.append("no JSON files found under " + ", ".join(paths))
    for path in files:
        doc, why = load(path)
        if doc is None:
            problems.append(why)
            continue
        kind = classify(doc, path)
        if kind == "merged":
            continue
        if kind is None:
            problems.append(f"{path}: neither a peer nor a stablegraph bench file; ignored")
            continue
        sources.append(path)
        w = workload_of(doc, path, workload_override)
        if kind == "peer":
            system = doc["system"]
            if doc.get("device"):
                devices.setdefault(system, doc["device"])
            if isinstance(doc.get("versions"), dict):
                versions.setdefault(system, doc["versions"])
            if doc.get("error"):
                problems.append(f"{w}: {system} could not run ({path}): {doc['error']}")
            rows = peer_rows(doc)
            if not rows and not doc.get("error"):
                problems.append(f"{w}: {path}: no results")
            peers.setdefault(w, []).extend(rows)
        else:
            slot = "fixed" if kind == "stablegraph-fixed" else "moving"
            entry = sg.setdefault(w, {})
            if slot in entry:
                problems.append(f"{w}: two stablegraph {slot} runs ({entry[slot][1]}, {path}); using the first")
                continue
            entry[slot] = (doc, path)
            if doc.get("device"):
                devices.setdefault("stablegraph", f"{doc['device']} (backend {doc.get('backend', '?')})")
            backend = doc.get("backend")
            if backend and backend != "cuda":
                problems.append(f"{w}: stablegraph ran on backend {backend!r} ({path}), not cuda: "
                                "its times do not compare with the GPU peers")
            if doc.get("error"):
                problems.append(f"{w}: stablegraph ({path}): {doc['error']}")

    workloads = {}
    names = [w for w in KNOWN_WORKLOADS if w in peers or w in sg]
    names += sorted(w for w in set(peers) | set(sg) if w not in KNOWN_WORKLOADS)
    for w in names:
        rows = []
        entry = sg.get(w, {})
        if entry:
            moving = entry.get("moving", (None, None))[0]
            fixed = entry.get("fixed", (None, None))[0]
            if moving is None:
                problems.append(f"{w}: stablegraph moving run missing (only the fixed run)")
            rows.extend(sg_rows(moving, fixed))
            if moving is not None and fixed is None and not any(
                    r.get("strategy") == SG_FLOOR_ROW for r in moving.get("results") or [] if isinstance(r, dict)):
                problems.append(f"{w}: no stablegraph floor (no --movement fixed run, no {SG_FLOOR_ROW} row)")
        else:
            problems.append(f"{w}: no stablegraph results")
        rows.extend(peers.get(w, []))
        seen = set()
        for r in rows:
            key = (r["system"], r["dtype"], r["strategy"])
            if key in seen:
                problems.append(f"{w}: {r['system']} {r['strategy']} ({r['dtype']}) appears twice")
            seen.add(key)
        rows.sort(key=lambda r: (SYSTEM_ORDER.get(r["system"], 9), r["dtype"] != "float32", r["dtype"]))
        assign_ratios(rows, problems, w)
        workloads[w] = rows
    merged = {
        "generated_by": "bench/peers/merge.py",
        "sources": sources,
        "devices": devices,
        "versions": versions,
        "problems": problems,
        "workloads": workloads,
    }
    return merged, problems


# ---------------------------------------------------------------- table


def fmt_us(v):
    """Like report.FormatUS: 2 decimals below 10, 1 below 1000, none above."""
    if v is None:
        return "-"
    a = abs(v)
    if a < 10:
        return f"{v:.2f}"
    if a < 1000:
        return f"{v:.1f}"
    return f"{v:.0f}"


def fmt_bytes(n):
    """Like report.FormatBytes: binary units."""
    if n is None:
        return "-"
    if n < 1024:
        return f"{n} B"
    v = float(n)
    suffix = ""
    for s in ("KiB", "MiB", "GiB", "TiB"):
        v /= 1024
        suffix = s
        if v < 1024:
            break
    return f"{v:.1f} {suffix}"


def fmt_ratio(r):
    return "-" if r is None else f"{r:.2f}x"


def p(v, key="p50"):
    return None if not v else v.get(key)


HEADER = ["system", "strategy", "wall p50", "wall p90", "batch", "host", "GPU p50", "GPU p90",
          "ratio", "GPU ratio", "memory", "note"]
RIGHT = {2, 3, 4, 5, 6, 7, 8, 9, 10}


def table_lines(rows, note_width=70):
    cells = [HEADER]
    for r in rows:
        name = r["strategy"] if r["dtype"] == "float32" else f"{r['strategy']} [{r['dtype']}]"
        note = r.get("error") or r.get("note") or ""
        if r.get("floor") == r["strategy"]:
            note = ("floor; " + note) if note else "floor"
        if len(note) > note_width:
            note = note[:note_width - 3] + "..."
        cells.append([
            r["system"], name,
            fmt_us(p(r["step_us"])), fmt_us(p(r["step_us"], "p90")), fmt_us(p(r["batch_us"])),
            fmt_us(p(r["host_us"])), fmt_us(p(r["gpu_us"])), fmt_us(p(r["gpu_us"], "p90")),
            fmt_ratio(r["ratio"]), fmt_ratio(r["gpu_ratio"]), fmt_bytes(r["peak_device_bytes"]), note,
        ])
    width = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    out = []
    for n, c in enumerate(cells):
        parts = [c[i].rjust(width[i]) if i in RIGHT else c[i].ljust(width[i]) for i in range(len(c))]
        out.append("  ".join(parts).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in width))
    return out


def render(merged):
    lines = []
    for name, dev in sorted(merged["devices"].items(), key=lambda kv: SYSTEM_ORDER.get(kv[0], 9)):
        lines.append(f"{name}: {dev}")
    for w, rows in merged["workloads"].items():
        lines.append("")
        lines.append(f"== {w} ==  (microseconds; ratio = p50 / p50 of the row's floor, same system)")
        lines.extend(table_lines(rows))
    if merged["problems"]:
        lines.append("")
        lines.append("problems:")
        lines.extend(f"  - {x}" for x in merged["problems"])
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Merge stablegraph and peer bench JSON into tables.")
    ap.add_argument("paths", nargs="+", help="JSON files or directories")
    ap.add_argument("--out", default="", help="write the merged JSON here")
    ap.add_argument("--workload", default=None, help="workload of every file (default: from directory or JSON)")
    args = ap.parse_args(argv)
    merged, _ = merge(args.paths, args.workload)
    sys.stdout.write(render(merged))
    if args.out:
        d = os.path.dirname(os.path.abspath(args.out))
        os.makedirs(d, exist_ok=True)
        tmp = args.out + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(merged, f, indent=2)
            f.write("\n")
        os.replace(tmp, args.out)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0 if any(merged["workloads"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
