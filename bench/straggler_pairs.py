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
"""
import json
import statistics
import sys


def rate(path):
    with open(path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    if not recs:
        raise SystemExit(f"straggler_pairs.py: {path} holds no iterations")
    return statistics.median(r["tokens_per_s"] for r in recs[len(recs) // 2:])


def main(argv):
    if len(argv) >= 4 and argv[1] == "--best":
        print(max(argv[3:], key=lambda n: rate(f"{argv[2]}/{n}.jsonl")))
        return
    if len(argv) < 3 or any(":" not in p for p in argv[2:]):
        raise SystemExit("usage: straggler_pairs.py OUT_DIR STATIC:DYNMO [STATIC:DYNMO ...]"
                         " | --best OUT_DIR NAME [NAME ...]")
    out = argv[1]
    ratios = []
    for pair in argv[2:]:
        static, dynmo = pair.split(":", 1)
        s, d = rate(f"{out}/{static}.jsonl"), rate(f"{out}/{dynmo}.jsonl")
        ratios.append(d / s)
        print(f"  {static:16s} {s:8.0f} tok/s   {dynmo:10s} {d:8.0f} tok/s   "
              f"dynmo / static {d / s:.3f}x")
    print(f"paired ratio over {len(ratios)} pairs: median {statistics.median(ratios):.3f}x, "
          f"lowest {min(ratios):.3f}x, highest {max(ratios):.3f}x (target >= 0.97x)")


if __name__ == "__main__":
    main(sys.argv)
