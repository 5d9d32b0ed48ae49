#!/usr/bin/env python3
"""scripts/paired-table.py FILE.json...: every row of `stablegraph bench
--json` files against the floor timed beside it (bench pairs the floor by
default): host p50 and p90, the floor's p50, the median host difference over the blocks,
latency and GPU time as ratios of the floor's, the driver probe's in-flight
price of a node update in the same run, and the nodes moved per step. Rows
without a paired floor (replay-fixed, eager) are left out. µs."""
import json, os, sys

if len(sys.argv) < 2:
    sys.exit(__doc__)
print("%-28s %-8s %8s %8s %8s %8s %7s %7s %7s %6s" % ("file", "strategy", "host", "host p90", "floor", "host-flr", "lat×", "GPU×", "probe", "moved"))
for path in sys.argv[1:]:
    with open(path) as f:
        rep = json.load(f)
    probe = (rep.get("node_update_probe") or {}).get("in_flight_us_per_node", float("nan"))
    for r in rep.get("results", []):
        pf = r.get("paired_floor")
        if not pf or r["strategy"] == "eager":
            continue
        print("%-28s %-8s %8.2f %8.2f %8.2f %8.2f %7.3f %7.3f %7.3f %6.1f" % (
            os.path.basename(path)[:-5], r["strategy"], r["host_us"]["p50"], r["host_us"].get("p90", float("nan")), pf["host_us"]["p50"],
            pf.get("host_over_us", float("nan")), pf.get("latency_ratio", float("nan")),
            pf.get("gpu_ratio", float("nan")), probe, r.get("moved_nodes_per_step", 0)))
