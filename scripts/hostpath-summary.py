#!/usr/bin/env python3
"""The summary of scripts/gpu-hostpath: given its work directory (status.tsv,
driver.json, bench-*.json, the benchmark and test logs), it prints each
step's status, the driver probe, every strategy of every bench against the
floor and the probe, the step-host and GEMM node update benchmarks, and the
targets of issue 25, PASS or FAIL."""
import glob, json, os, sys
work = sys.argv[1]

def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

print("== status (step, exit status, seconds; 124: timed out)")
for line in open(os.path.join(work, "status.tsv")):
    print("  " + line.rstrip("\n").replace("\t", "  "))

drv = load(os.path.join(work, "driver.json"))
if drv:
    print("\n== driver probe (p50 us; %s, driver %s)" % (drv.get("device"), drv.get("device_props", {}).get("driver_version")))
    rows = {r["name"]: r.get("p50_us") for r in drv.get("rows", [])}
    cols = [("idle", "idle, per node"), ("in flight", "in flight, per node"), ("per call", "GraphExecKernelNodeSetParams, idle, per node"),
            ("step/node", "step cost per updated node"), ("launch", "launch awaited, no update, plain nodes"),
            ("dev-upd", "launch awaited, no update, every node device-updatable")]
    whole = [("tmpl set", "template node set, per node"), ("exec upd", "GraphExecUpdate"), ("whole/node", "template + update, per node")]
    print("  %-14s" % "P, K" + "".join("%11s" % c for c, _ in cols + whole))
    for p in drv.get("param_bytes", []):
        for k in drv.get("update_nodes", []):
            vals = [rows.get("node update P=%dB K=%d: %s" % (p, k, n)) for _, n in cols]
            vals += [rows.get("whole update P=%dB K=%d: %s" % (p, k, n)) for _, n in whole]
            print("  %-14s" % ("%d B, %d" % (p, k)) + "".join("%11s" % ("%.3f" % v if v is not None else "-") for v in vals))

single_skip = {"replay-fixed", "auto"}
verdicts = []
for path in sorted(glob.glob(os.path.join(work, "bench-*.json"))):
    rep = load(path)
    name = os.path.basename(path)[len("bench-"):-len(".json")]
    if not rep:
        print("\n== %s: no report" % name)
        verdicts.append((name, "report", False, "no report"))
        continue
    rows = {r["strategy"]: r for r in rep["results"]}
    floor = rows.get("replay-fixed")
    probe = (rep.get("node_update_probe") or {}).get("in_flight_us_per_node")
    print("\n== %s: %s" % (name, rep["workload"]))
    print("   probe in flight: %s us/node" % ("%.3f" % probe if probe else "-"))
    hdr = "   %-13s %9s %9s %9s %8s %9s %8s %8s %8s %7s %s"
    print(hdr % ("strategy", "host p50", "host-flr", "moved/st", "us/node", "÷probe", "lat×flr", "wall×flr", "GPU×flr", "check", "note"))
    p50 = lambda r, k: (r.get(k) or {}).get("p50")
    def ratio(r, k):
        # Latency and GPU time against the floor's step timed beside each
        # of the row's (bench --pair-floor): the medians of the per-step
        # ratios.
        if k == "latency_us" and (r.get("paired_floor") or {}).get("latency_ratio"):
            return r["paired_floor"]["latency_ratio"]
        if k == "step_us" and (r.get("paired_floor") or {}).get("gpu_ratio"):
            return r["paired_floor"]["gpu_ratio"]
        a, b = p50(r, k), p50(floor, k) if floor else None
        return a / b if a and b else None
    fmt = lambda v, f="%.2f": (f % v) if v is not None else "-"
    for st, r in rows.items():
        over = r.get("host_over_floor_us")
        per = r.get("host_us_per_moved_node")
        vs = per / probe if per is not None and probe else None
        ok = "yes" if r.get("outputs_match_eager") else ("-" if "not supported" in r.get("note", "") else "NO")
        print(hdr % (st, fmt(p50(r, "host_us")), fmt(over), fmt(r.get("moved_nodes_per_step"), "%.1f"), fmt(per), fmt(vs),
                     fmt(ratio(r, "latency_us"), "%.3f"), fmt(ratio(r, "wall_us"), "%.3f"), fmt(ratio(r, "step_us"), "%.3f"), ok,
                     (r.get("note", "")[:60] if st == "auto" else "")))
    if not floor:
        verdicts.append((name, "floor", False, "no floor row"))
        continue
    base = name.split("-pingpong")[0].removesuffix("-pinned")
    pingpong = name.endswith("-pingpong")
    variant = name.endswith(("-inline", "-lead"))  # one strategy with an option: no best-of verdict
    bad = [st for st, r in rows.items() if not r.get("outputs_match_eager") and "not supported" not in r.get("note", "")]
    verdicts.append((name, "bit-identical to eager", not bad, ",".join(bad) or "all match"))
    if not pingpong:
        p = rows.get("patch")
        if p and probe and p.get("host_over_floor_us") is not None:
            lim = 1.5 * probe * p.get("moved_nodes_per_step", 0) + 1
            verdicts.append((name, "patch host-floor <= 1.5*probe*moved+1", p["host_over_floor_us"] <= lim,
                             "%.2f vs %.2f us" % (p["host_over_floor_us"], lim)))
        d = rows.get("device")
        if d and d.get("host_over_floor_us") is not None:
            verdicts.append((name, "device host <= floor+2", d["host_over_floor_us"] <= 2, "%+.2f us" % d["host_over_floor_us"]))
        lims = 1.05 if base == "mlp" else 1.03
        best = None if variant else min(((ratio(r, "latency_us"), st) for st, r in rows.items() if st not in single_skip and ratio(r, "latency_us")), default=None)
        if best:
            verdicts.append((name, "best latency <= %.2fx floor" % lims, best[0] <= lims, "%s %.3f" % (best[1], best[0])))
    a = rows.get("auto")
    if a:
        # auto against the candidates it chooses among.
        cands = ("patch", "device", "stable", "pool")
        singles = [(p50(r, "wall_us"), st) for st, r in rows.items() if st in cands and p50(r, "wall_us")]
        if singles and p50(a, "wall_us"):
            bw = min(singles)
            verdicts.append((name, "auto wall <= 1.02x best", p50(a, "wall_us") <= 1.02 * bw[0], "%.1f vs %s %.1f" % (p50(a, "wall_us"), bw[1], bw[0])))
        # Latency: each row's over the floor's (paired when the bench
        # paired them), so that rows run seconds apart compare.
        lats = [(ratio(r, "latency_us"), st) for st, r in rows.items() if st in cands and ratio(r, "latency_us")]
        if lats and ratio(a, "latency_us"):
            bl = min(lats)
            verdicts.append((name, "auto latency <= 1.03x best", ratio(a, "latency_us") <= 1.03 * bl[0],
                             "%.3f vs %s %.3f (x floor)" % (ratio(a, "latency_us"), bl[1], bl[0])))
        # Its own host cost once it has kept one: none but the kept strategy's
        # (the warm-up must cover the probes: a measured probe step says so).
        note = a.get("note", "")
        verdicts.append((name, "auto: no probe step measured", "of the measured steps probed" not in note,
                         "warm-up covers the probes" if "of the measured steps probed" not in note else "raise --warmup"))
        kept = note[len("ran "):].split(":")[0] if note.startswith("ran ") else None
        k = rows.get(kept) if kept else None
        hs = a.get("host_samples_us") or []
        if len(hs) >= 20:
            # A host cost that fades over the measured steps is not auto's
            # own per step (the collector, the driver after the others
            # closed): the first and the last ten steps apart.
            med = lambda v: sorted(v)[len(v) // 2]
            print("   auto host p50, first 10 measured steps %.2f, last 10 %.2f us" % (med(hs[:10]), med(hs[-10:])))
        if k and a.get("host_over_floor_us") is not None and k.get("host_over_floor_us") is not None:
            ao, ko = a["host_over_floor_us"], k["host_over_floor_us"]
            verdicts.append((name, "auto host-floor <= kept's +1 us", ao <= ko + 1, "%.2f vs %s %.2f us over the floor" % (ao, kept, ko)))

# The step-host benchmark as a table: per workload, pattern and way, Run's
# host p50 taken apart (us), and its difference from the floor's (the same
# workload's fixed/patch row).
steprows = []
if os.path.exists(os.path.join(work, "stephost.log")):
    for l in open(os.path.join(work, "stephost.log")):
        f = l.split()
        if not f or not f[0].startswith("BenchmarkCUDAStepHost/"):
            continue
        parts = f[0][len("BenchmarkCUDAStepHost/"):].rsplit("-", 1)[0].split("/")
        if len(parts) != 3:
            continue
        m = {f[i + 1]: float(f[i]) for i in range(2, len(f) - 1, 2) if f[i + 1] != "ns/op"}
        steprows.append((parts, m))
if steprows:
    floors = {parts[0]: m.get("run-µs") for parts, m in steprows if parts[1] == "fixed" and parts[2] == "patch"}
    print("\n== step host p50 taken apart (us; rest = run - updates - launch - other: the runtime's own work)")
    print("   %-14s %-7s %-14s %7s %7s %7s %7s %8s %6s %6s %7s %7s" % ("workload", "pattern", "way", "run", "-floor", "launch", "updates", "patcher", "n", "other", "rest", "moved"))
    for (w, pat, way), m in steprows:
        g = lambda k: m.get(k, float("nan"))
        fl = floors.get(w)
        print("   %-14s %-7s %-14s %7.2f %7s %7.2f %7.2f %8.2f %6.1f %6.2f %7.2f %7.1f" % (
            w, pat, way, g("run-µs"), "%.2f" % (g("run-µs") - fl) if fl else "-", g("launch-µs"), g("updates-µs"),
            g("patcher-µs"), g("updates/step"), g("other-µs"), g("rest-µs"), g("moved/step")))

# patch's moving step against the driver's price of the same move
# (BenchmarkCUDARunAgainstRaw): per run (inputs made each step; made in
# page-locked memory; made once), Run - the floor's Run, the driver's move
# after the inputs' write and after a launch (each less a launch), and what
# Run adds to the first.
raws = [(p, n) for p, n in (("runraw.log", "inputs made each step"), ("runraw-pinned.log", "inputs in page-locked memory"),
                             ("runraw-same.log", "inputs made once")) if os.path.exists(os.path.join(work, p))]
if raws:
    print("\n== patch's Run against the driver's move (us; BenchmarkCUDARunAgainstRaw)")
    print("   %-30s %-14s %8s %10s %12s %9s" % ("run", "workload", "run-flr", "move-bind", "move-launch", "Run adds"))
    for path, what in raws:
        for l in open(os.path.join(work, path)):
            f = l.split()
            if not f or not f[0].startswith("BenchmarkCUDARunAgainstRaw/"):
                continue
            m = {f[i + 1]: float(f[i]) for i in range(2, len(f) - 1, 2) if f[i + 1] != "ns/op"}
            g = lambda k: m.get(k, float("nan"))
            rf = g("run-µs") - g("floor-µs")
            mb = g("move-after-bind-µs") - g("launch-µs")
            ml = g("move-after-launch-µs") - g("launch-µs")
            print("   %-30s %-14s %8.2f %10.2f %12.2f %9.2f" % (what, f[0].split("/", 1)[1].rsplit("-", 1)[0], rf, mb, ml, rf - mb))

for path in ("stephost.log", "autohost.log", "gemmupdate.log"):
    lines = [l.rstrip() for l in open(os.path.join(work, path))] if os.path.exists(os.path.join(work, path)) else []
    lines = [l for l in lines if l.startswith("Benchmark") or "auto kept" in l]
    if lines:
        print("\n== %s" % path)
        for l in lines:
            print("  " + " ".join(l.split()))
for path in sorted(glob.glob(os.path.join(work, "test-*.log"))):
    fails = [l.strip() for l in open(path) if l.startswith("--- FAIL") or l.startswith("FAIL")]
    verdicts.append((os.path.basename(path)[:-4], "tests pass", not fails and any(l.startswith("PASS") or l.startswith("ok") for l in open(path)), "; ".join(fails[:3]) or "ok"))

print("\n== targets (issue 25)")
for name, what, ok, detail in verdicts:
    print("  %-4s %-22s %-40s %s" % ("PASS" if ok else "FAIL", name, what, detail))
