#!/usr/bin/env python3
"""The straggler benches' repeated comparison: DynMo against the best static
split, run after run under the same throttle, in pairs run back to back.

Single runs on a shared 2-core VM scatter by more than the gap measured
(static 0,7,10 alone has read 5,294 to 6,778 tokens/s over an afternoon),
so one ratio says little; the median of the paired ratios says more.

    straggler_pairs.py OUT_DIR STATIC:DYNMO [STATIC:DYNMO ...]
    straggler_pairs.py --best OUT_DIR NAME [NAME ...]

Each NAME is OUT_DIR/NAME.jsonl (one record per iteration with
``tokens_per_s``, as dynmo-train's --log_json and the Python example's
write); a run's rate is its median tokens/s over the last half of its
iterations. The first form prints each pair's rates and their ratio, then
the median, lowest and highest ratio; --best prints the NAME with the
highest rate (the benches' best static split).

Under each pair it also prints DynMo's plans (the split each one applied
and the first iteration run on it, from the records' ``epoch`` and
``boundaries``) and both runs' median tokens/s over the iterations after
DynMo's last plan: a pair's ratio is low either because DynMo moved late
(the last-half median still counts iterations before its move) or because
the two runs went at different paces on the same split (the VM drifted
between them); that line tells which.
"""
import json
import statistics
import sys


def records(path):
    with open(path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    if not recs:
        raise SystemExit(f"straggler_pairs.py: {path} holds no iterations")
    return recs


def rate(recs):
    """Median tokens/s over the last half of a run's records."""
    return statistics.median(r["tokens_per_s"] for r in recs[len(recs) // 2:])


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


def main(argv):
    if len(argv) >= 4 and argv[1] == "--best":
        print(max(argv[3:], key=lambda n: rate(records(f"{argv[2]}/{n}.jsonl"))))
        return
    if len(argv) < 3 or any(":" not in p for p in argv[2:]):
        raise SystemExit("usage: straggler_pairs.py OUT_DIR STATIC:DYNMO [STATIC:DYNMO ...]"
                         " | --best OUT_DIR NAME [NAME ...]")
    out = argv[1]
    ratios = []
    for pair in argv[2:]:
        static, dynmo = pair.split(":", 1)
        static_recs = records(f"{out}/{static}.jsonl")
        dynmo_recs = records(f"{out}/{dynmo}.jsonl")
        s, d = rate(static_recs), rate(dynmo_recs)
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
          f"lowest {min(ratios):.3f}x, highest {max(ratios):.3f}x (target >= 0.97x)")


if __name__ == "__main__":
    main(sys.argv)
