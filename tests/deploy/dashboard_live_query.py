#!/usr/bin/env python3
"""The assertions of dashboard_live_test.sh, against a running Prometheus.

    dashboard_live_query.py PROMETHEUS_URL DASHBOARD.json JOB
                            [--positive=ID,...] [--released]

Asserts that the DynMo job label survived the scrape (the dashboard's job
variable query, label_values(dynmo_imbalance_ratio, job), finds JOB), that
every panel query of the dashboard, with $job = JOB and $__rate_interval =
1m, returns at least one series with a number in it (not all NaN), that the
panels named by --positive show some value above zero (they saw activity,
not only idle counters), with --released that the job has released GPUs, and
that the alert rules Prometheus loaded evaluate without errors. Standard
library only.
"""
import argparse
import json
import math
import os
import sys
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dashboard_check  # noqa: E402


def get(url, path, **params):
    q = urllib.parse.urlencode(params, doseq=True)
    with urllib.request.urlopen(f"{url}{path}?{q}", timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{path} {params}: {body}")
    return body["data"]


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("dashboard")
    ap.add_argument("job")
    ap.add_argument("--positive", default="")
    ap.add_argument("--released", action="store_true")
    a = ap.parse_args(argv[1:])
    url, dash_path, job = a.url, a.dashboard, a.job
    positive = {int(x) for x in a.positive.split(",") if x}
    seen_positive = set()
    with open(dash_path, encoding="utf-8") as f:
        dash = json.load(f)
    errors = []

    var = next(v for v in dash["templating"]["list"] if v["name"] == "job")
    metric = var["definition"].split("(", 1)[1].split(",", 1)[0].strip()
    jobs = get(url, "/api/v1/label/job/values", **{"match[]": metric})
    print(f"job variable: label_values({metric}, job) = {jobs}")
    if job not in jobs:
        errors.append(f"job variable would not offer {job!r} (got {jobs}); "
                      "is honor_labels set in the scrape config?")

    for pid, ref, title, expr in dashboard_check.queries(dash, {"job": job}):
        data = get(url, "/api/v1/query", query=expr)
        result = data["result"]
        numbers = [float(s["value"][1]) for s in result]
        finite = [x for x in numbers if not math.isnan(x)]
        shown = ", ".join(f"{x:.4g}" for x in numbers[:4]) + (" ..." if len(numbers) > 4 else "")
        status = "ok" if finite else "FAIL"
        print(f"{status:4} panel {pid:2} {ref} {title}: {len(result)} series [{shown}]  {expr}")
        if not finite:
            errors.append(f"panel {pid} ({title}) {ref}: no data for {expr}")
        if any(x > 0 for x in finite):
            seen_positive.add(pid)
    for pid in sorted(positive - seen_positive):
        errors.append(f"panel {pid}: every value is zero; it saw no activity")

    if a.released:
        q = f'dynmo_gpus{{job="{job}", state="released"}} > 0'
        result = get(url, "/api/v1/query", query=q)["result"]
        print(f"released GPUs of {job}: {[s['value'][1] for s in result]}")
        if not result:
            errors.append(f"{job} released no GPUs ({q} is empty)")

    groups = get(url, "/api/v1/rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    bad = [f"{r['name']}: {r.get('lastError')}" for r in rules if r.get("health") != "ok"]
    print(f"alert rules loaded: {len(rules)}, unhealthy: {bad}")
    if not rules:
        errors.append("no alert rules loaded")
    errors += [f"rule {b}" for b in bad]

    for e in errors:
        print(f"FAIL {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
