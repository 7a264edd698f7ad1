#!/usr/bin/env python3
"""Summarises one dynmo-train --log_json run for bench/dynamism_bench.sh.

Prints one JSON object: tokens/s over the iterations after --skip warm-up
ones (total tokens / total wall time, so slow migration iterations count),
the measured bubble ratio (1 - mean stage compute / iteration time: the
share of the iteration a stage spends waiting or communicating), the time
spent in iterations that applied a plan beyond the median iteration
(balancing + migration overhead), plans applied, and the final boundaries.
"""
import json
import statistics
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: dynamism_summary.py RUN.jsonl [--skip N]")
    path = sys.argv[1]
    skip = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--skip" else 2
    records = [json.loads(line) for line in open(path) if line.strip()]
    if len(records) <= skip:
        sys.exit(f"{path}: {len(records)} records, need more than {skip}")
    steady = records[skip:]
    seconds = sum(r["iteration_s"] for r in steady)
    tokens = sum(r["tokens_per_s"] * r["iteration_s"] for r in steady)
    bubbles = []
    for r in steady:
        stages = r["stage_times"]
        bubbles.append(1.0 - (sum(stages) / len(stages)) / r["iteration_s"])
    median = statistics.median(r["iteration_s"] for r in steady)
    overhead = 0.0
    previous_epoch = records[skip - 1]["epoch"] if skip > 0 else 0
    for r in steady:
        if r["epoch"] != previous_epoch:
            overhead += max(0.0, r["iteration_s"] - median)
        previous_epoch = r["epoch"]
    last = records[-1]
    stage_last = last["stage_times"]
    mean_stage = sum(stage_last) / len(stage_last)
    print(json.dumps({
        "iterations": len(steady),
        "tokens_per_s": tokens / seconds,
        "bubble_ratio": statistics.mean(bubbles),
        "balance_and_migration_s": overhead,
        "plans_applied": last["epoch"],
        "final_boundaries": last["boundaries"],
        "final_imbalance": (max(stage_last) - min(stage_last)) / mean_stage
        if mean_stage > 0 else 0.0,
        "loss_first": records[0]["loss"],
        "loss_last": last["loss"],
    }))


if __name__ == "__main__":
    main()
