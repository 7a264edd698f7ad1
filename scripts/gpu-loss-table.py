#!/usr/bin/env python3
"""The GPU check's loss table (scripts/gpu-check.sh, step "losses"): every
run's losses and speed from the JSON lines dynmo-train and the Python
adapter log, and each pair's agreement over the iterations both ran.

    gpu-loss-table.py RUNS_DIR TOLERANCE A:B ...

Prints one row per RUNS_DIR/<name>.jsonl (iterations, first and last loss,
median tokens/s and iteration time after the first two), then one row per
pair: bit-identical, close (relative difference of the last common loss <=
TOLERANCE) or DIFFERENT. Exits 1 when any pair is DIFFERENT.
"""
import json, os, sys
runs, tol, pairs = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
def records(name):
    path = os.path.join(runs, name + ".jsonl")
    if not os.path.exists(path):
        return None
    out = []
    for line in open(path):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if "loss" in r:
            out.append(r)
    return out
def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")
names = sorted(f[:-6] for f in os.listdir(runs) if f.endswith(".jsonl"))
recs = {n: records(n) for n in names}
data = {n: [float(r["loss"]) for r in recs[n]] for n in names}
print(f"{'run':<20}{'iters':>6}{'first loss':>14}{'final loss':>14}{'median tok/s':>14}{'median iter ms':>16}")
for n in names:
    l, rs = data[n], recs[n][2:]
    speed = median([r.get("tokens_per_s", 0) for r in rs])
    it = median([r.get("iteration_s", 0) for r in rs]) * 1e3
    print(f"{n:<20}{len(l):>6}" + (f"{l[0]:>14.6f}{l[-1]:>14.6f}{speed:>14.0f}{it:>16.2f}"
                                   if l else "  (no loss records)"))
print(f"\n{'pair':<36}{'iters':>6}{'final a':>12}{'final b':>12}{'max |diff|':>12}{'rel final':>11}  verdict")
bad = 0
for p in pairs:
    a, b = p.split(":")
    la, lb = data.get(a), data.get(b)
    if not la or not lb:
        print(f"{a + ' vs ' + b:<36}  n/a (a run is missing)")
        continue
    n = min(len(la), len(lb))
    diff = max(abs(x - y) for x, y in zip(la[:n], lb[:n]))
    rel = abs(la[n - 1] - lb[n - 1]) / max(abs(lb[n - 1]), 1e-12)
    verdict = "bit-identical" if la[:n] == lb[:n] else ("close" if rel <= tol else "DIFFERENT")
    if verdict == "DIFFERENT":
        bad += 1
    print(f"{a + ' vs ' + b:<36}{n:>6}{la[n-1]:>12.6f}{lb[n-1]:>12.6f}{diff:>12.3e}{rel:>11.2e}  {verdict}")
print(f"\ntolerance: relative difference of the last common loss <= {tol}")
sys.exit(1 if bad else 0)
