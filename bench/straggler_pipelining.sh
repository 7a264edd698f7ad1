#!/usr/bin/env bash
# A straggler under torch.distributed.pipelining: examples/torch/
# llama_pipelining.py (2 pipeline ranks under torchrun, Gloo, each pinned
# to its own core) with rank 1's core shared with a busy loop, so rank 1
# really runs at about half speed (no sleep in DynMo's code). Side by side,
# each under the same throttle:
#   static-balanced  the even split 0,5,10 (8 blocks + embedding + head),
#                    fixed;
#   static-<cut>     the fixed splits 0,<cut>,10 for cut 6, 7, 8 (the best
#                    of them is the best static split under the throttle);
#   dynmo            the embedded coordinator (trigger auto, the adapter's
#                    speed probe every 5 iterations) starting from 0,5,10;
# and, without the throttle, dynmo again (no plan expected). Prints tokens/s
# (median of the last half of the iterations), the split each ended on, its
# plans (and the rank speeds and plans from the embedded coordinator's
# event log, kept as OUT/NAME.coordinator.log), and whether dynmo's losses
# equal static-balanced's. REPEATS=N (default 3) then runs the best static
# split and dynmo N-1 more times under the throttle, back to back, the order
# alternating from pair to pair (static first in the odd ones, dynmo first
# in the even ones), and prints the paired ratios and their median
# (bench/straggler_pairs.py): single runs here scatter by more than the gap.
# THROTTLE_NICE=N runs the busy loop at nice N, a milder throttle (about
# 0.56 of the core at 2, 0.75 at 5: bench/local_ranks.sh).
#
#   bash bench/straggler_pipelining.sh [BUILD_DIR]     (STEPS=120 by default)
#
# Needs BUILD_DIR (default build) to hold the dynmo Python package and
# dynmo-coordinator (ninja -C build dynmo_python dynmo-coordinator), the
# torch venv of scripts/install-torch.sh, taskset and two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/local_ranks.sh
build="${1:-build}"
venv="$(bash scripts/install-torch.sh | tail -n 1)"
export PYTHONPATH="$PWD/$build/python" DYNMO_BIN_DIR="$PWD/$build/bin" OMP_NUM_THREADS=1
steps="${STEPS:-120}"
repeats="${REPEATS:-3}"
out="${OUT:-out/straggler-pipelining}"
mkdir -p "$out"
job=(--schedule 1F1B --steps "$steps" --layers 8 --dim 128 --seq_len 64
     --microbatches 8 --micro_batch 4)

trap throttle_off EXIT

run() {  # NAME [example flags...]: rank r pinned to core r.
  local name=$1
  shift
  echo "== $name" >&2
  # The embedded coordinator's event log (rank speeds, plans) is kept.
  DYNMO_COORDINATOR_LOG="$out/$name.coordinator.log" \
    pinned_example "$venv" "$out/$name.log" "${job[@]}" --log_json "$out/$name.jsonl" "$@"
}

throttle_on 1
run static-balanced --coordinator none --initial_boundaries 0,5,10
for cut in 6 7 8; do
  run "static-$cut" --coordinator none --initial_boundaries "0,$cut,10"
done
run dynmo --coordinator embedded --trigger auto --initial_boundaries 0,5,10
best=$("$venv/bin/python" bench/straggler_pairs.py --best "$out" static-6 static-7 static-8)
best=${best#static-}
pairs=("static-$best:dynmo")
# The first pair ran static first; the next runs DynMo first, and so on
# (ABBA), so a drift of the machine over the invocation favours neither
# side of the median.
for i in $(seq 2 "$repeats"); do
  if (( i % 2 == 0 )); then
    run "dynmo-$i" --coordinator embedded --trigger auto --initial_boundaries 0,5,10
    run "static-$best-$i" --coordinator none --initial_boundaries "0,$best,10"
  else
    run "static-$best-$i" --coordinator none --initial_boundaries "0,$best,10"
    run "dynmo-$i" --coordinator embedded --trigger auto --initial_boundaries 0,5,10
  fi
  pairs+=("static-$best-$i:dynmo-$i")
done
throttle_off
run dynmo-unthrottled --coordinator embedded --trigger auto --initial_boundaries 0,5,10
run static-unthrottled --coordinator none --initial_boundaries 0,5,10

"$venv/bin/python" - "$out" <<'PY'
import sys
sys.path.insert(0, "bench")
from straggler_pairs import moves_text, plans, rate, records
out = sys.argv[1]
def recs(n):
    return records(f"{out}/{n}.jsonl")
rows = {}
for n in ["static-balanced", "static-6", "static-7", "static-8", "dynmo",
          "dynmo-unthrottled", "static-unthrottled"]:
    rs = recs(n)
    epochs = sorted({r["epoch"] for r in rs}) [1:]
    rows[n] = rate(rs)
    print(f"{n:20s} {rows[n]:9.0f} tok/s (last half)  final split "
          f"{','.join(map(str, rs[-1]['boundaries']))}  plans {len(epochs)} "
          f"{moves_text(plans(rs))}")
best = max(("static-balanced", "static-6", "static-7", "static-8"), key=rows.get)
print(f"\nthrottled: dynmo / best static ({best}) = {rows['dynmo'] / rows[best]:.3f}x "
      f"(target >= 0.97x); dynmo / static-balanced = "
      f"{rows['dynmo'] / rows['static-balanced']:.2f}x (target >= 1.35x)")
same = [r["loss"] for r in recs("dynmo")] == [r["loss"] for r in recs("static-balanced")]
print("losses dynmo vs static-balanced (throttled):", "identical" if same else "DIFFER")
PY
grep -h "rank_speed\|plan_applied" "$out"/dynmo.coordinator.log "$out"/dynmo-unthrottled.coordinator.log \
  | cut -c1-200 | sed 's/^/  /' | head -20 || true
echo "== dynmo against the best static split (0,$best,10), pairs run back to back =="
"$venv/bin/python" bench/straggler_pairs.py "$out" "${pairs[@]}"
echo "records: $out"
