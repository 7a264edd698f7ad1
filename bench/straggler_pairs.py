#!/usr/bin/env python3
"""The benches' repeated comparison: DynMo against the best static split,
run after run on the same machine, in pairs run back to back (the straggler
benches under their throttle, the adapter's side by side, the idle
overhead).

Single runs on a shared 2-core VM scatter by more than the gap measured
(static 0,7,10 alone has read 5,294 to 6,778 tokens/s over an afternoon),
so one ratio says little; the median of the paired ratios says more.

    straggler_pairs.py [--skip N] [--target X] OUT_DIR STATIC:DYNMO [...]
    straggler_pairs.py [--skip N] --best OUT_DIR NAME [NAME ...]

Each NAME is OUT_DIR/NAME.jsonl (one record per iteration with
``tokens_per_s``, as dynmo-train's --log_json and the Python example's
write); a run's rate is its median tokens/s over the last half of its
iterations, or with --skip N over every record from the N-th on (the
adapter's side by side: all but its 2 warm-up iterations, so DynMo's
iterations before its move count). The first form prints each pair's rates
and their ratio, then the median, lowest and highest ratio against the
target (--target, default 0.97, the straggler benches'); --best prints the
NAME with the highest rate (the benches' best static split).

After the pairs it prints every measured plan of the DynMo runs, predicted
against realized gain (the embedded coordinator's plan_realized events,
read from OUT_DIR/DYNMO.coordinator.log, else from the event lines in
OUT_DIR/DYNMO.rank0.out, where dynmo-train's rank 0 writes them), and the
median absolute prediction error of those measured across no model change.

Under each pair it also prints DynMo's plans (the split each one applied
and the first iteration run on it, from the records' ``epoch`` and
``boundaries``) and both runs' median tokens/s over the iterations after
DynMo's last plan: a pair's ratio is low either because DynMo moved late
(the last-half median still counts iterations before its move) or because
the two runs went at different paces on the same split (the VM drifted
between them); that line tells which.
"""
import json
import os
import re
import statistics
import sys


def records(path):
    with open(path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    if not recs:
        raise SystemExit(f"straggler_pairs.py: {path} holds no iterations")
    return recs


def events(path, kind):
    """The `kind` events of a coordinator event log (logfmt lines, key=value
    ...; other lines skipped), numbers as floats; [] if there is no file."""
    if not os.path.exists(path):
        return []
    found = []
    with open(path, errors="replace") as f:
        for line in f:
            fields = {k: v.strip('"') for k, v in re.findall(r'(\w+)=("[^"]*"|\S+)', line)}
            if fields.get("event") == kind:
                found.append({k: float(v) if re.fullmatch(r"[-+0-9.eE]+", v) else v
                              for k, v in fields.items()})
    return found


def plan_gains(out, runs):
    """Prints each measured plan of `runs` (predicted, realized, error) and
    the median absolute error of those measured across no model change."""
    rows = []
    for run in runs:
        log = f"{out}/{run}.coordinator.log"
        if not os.path.exists(log):
            log = f"{out}/{run}.rank0.out"
        rows += [(run, e) for e in events(log, "plan_realized")]
    if not rows:
        print("predicted vs realized gain: no plan measured (no plan_realized event)")
        return
    print("| run | epoch | at iteration | predicted gain | realized gain | error (points) "
          "| spread | model changed inside |")
    print("|---|---|---|---|---|---|---|---|")
    errors, across = [], []
    for run, e in rows:
        changed = e.get("model_changed") == "true"
        (across if changed else errors).append(abs(e["error"]) * 100)
        print(f"| {run} | {e['epoch']:.0f} | {e['apply_iteration']:.0f} | "
              f"{e['predicted_gain']:+.1%} | {e['realized_gain']:+.1%} | "
              f"{e['error'] * 100:+.1f} | {e.get('spread', 0):.1%} | "
              f"{'yes' if changed else 'no'} |")
    print("median absolute prediction error: "
          + (f"{statistics.median(errors):.1f} points over {len(errors)} plans (target <= 3)"
             if errors else "no plan measured across no model change")
          + (f"; {len(across)} more measured across a model change (median "
             f"{statistics.median(across):.1f} points), not counted" if across else ""))


def rate(recs, skip=None):
    """Median tokens/s over the last half of a run's records, or over the
    records from index `skip` on."""
    first = len(recs) // 2 if skip is None else min(skip, len(recs) - 1)
    return statistics.median(r["tokens_per_s"] for r in recs[first:])


def iteration(r):
    return r["iteration"] if "iteration" in r else r["iter"]


def plans(recs):
    """(first iteration on it, split) of each plan the run applied."""
    return [(iteration(b), ",".join(map(str, b["boundaries"])))
            for a, b in zip(recs, recs[1:]) if b.get("epoch") != a.get("epoch")]


def moves_text(moved):
    """Plans as "SPLIT@ITERATION ..." (the benches' summaries print them so)."""
    return " ".join(f"{split}@{it}" for it, split in moved)


def after(recs, first):
    """Median tokens/s over the iterations from `first` on (None if none)."""
    rates = [r["tokens_per_s"] for r in recs if iteration(r) >= first]
    return statistics.median(rates) if rates else None


USAGE = ("usage: straggler_pairs.py [--skip N] [--target X] OUT_DIR STATIC:DYNMO"
         " [STATIC:DYNMO ...] | [--skip N] --best OUT_DIR NAME [NAME ...]")


def options(argv):
    """(skip, target, the rest) from argv[1:]; a bad option exits with USAGE."""
    args, skip, target = list(argv[1:]), None, 0.97
    while args and args[0] in ("--skip", "--target"):
        flag = args.pop(0)
        try:
            value = args.pop(0)
            if flag == "--skip":
                skip = int(value)
                if skip < 0:
                    raise ValueError(value)
            else:
                target = float(value)
        except (IndexError, ValueError):
            raise SystemExit(f"straggler_pairs.py: {flag} wants a "
                             f"{'count >= 0' if flag == '--skip' else 'number'}; {USAGE}")
    return skip, target, args


def main(argv):
    skip, target, args = options(argv)
    if len(args) >= 3 and args[0] == "--best":
        print(max(args[2:], key=lambda n: rate(records(f"{args[1]}/{n}.jsonl"), skip)))
        return
    if len(args) < 2 or any(":" not in p for p in args[1:]):
        raise SystemExit(USAGE)
    out = args[0]
    ratios = []
    for pair in args[1:]:
        static, dynmo = pair.split(":", 1)
        static_recs = records(f"{out}/{static}.jsonl")
        dynmo_recs = records(f"{out}/{dynmo}.jsonl")
        s, d = rate(static_recs, skip), rate(dynmo_recs, skip)
        ratios.append(d / s)
        print(f"  {static:16s} {s:8.0f} tok/s   {dynmo:10s} {d:8.0f} tok/s   "
              f"dynmo / static {d / s:.3f}x")
        moved = plans(dynmo_recs)
        if moved:
            first = moved[-1][0]
            ds, ss = after(dynmo_recs, first), after(static_recs, first)
            line = moves_text(moved)
            if ds is not None and ss is not None:
                line += (f"; from iteration {first} on: dynmo {ds:.0f}, static {ss:.0f} tok/s "
                         f"({ds / ss:.3f}x)")
            print(f"      dynmo's plans {line}")
        else:
            print("      dynmo made no plan")
    print(f"paired ratio over {len(ratios)} pairs: median {statistics.median(ratios):.3f}x, "
          f"lowest {min(ratios):.3f}x, highest {max(ratios):.3f}x (target >= {target:.2f}x)")
    plan_gains(out, [pair.split(":", 1)[1] for pair in args[1:]])


if __name__ == "__main__":
    main(sys.argv)
