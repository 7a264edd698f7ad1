#!/bin/bash
# A straggler on real cores: two ranks of dynmo-train (8 blocks = 10 pipeline
# layers), each pinned to its own core, and rank 1's core shared with a busy
# loop, so rank 1 really runs at about half speed (no sleep anywhere in
# DynMo's code). Side by side, each under the same throttle:
#   static-balanced  the split that is best unthrottled (0,5,10), fixed;
#   static-best      the best fixed split under the throttle, found by
#                    trying every split;
#   dynmo            the coordinator (embedded, auto trigger, speed probes
#                    every 10 iterations) starting from 0,5,10;
# and, without the throttle, dynmo again (no plan expected). Prints tokens/s
# (median of the last half of the iterations), the final split, the
# rank speeds the coordinator saw, and whether the losses match.
# REPEATS=N (default 3) then runs the best static split and dynmo N-1 more
# times under the throttle, back to back, the order alternating from pair
# to pair (static first in the odd ones, dynmo first in the even ones), and
# prints the paired ratios and their median (bench/straggler_pairs.py):
# single runs here scatter by more than the gap. THROTTLE_NICE=N runs the
# busy loop at nice N, a milder throttle (about 0.56 of the core at 2, 0.75
# at 5: bench/local_ranks.sh; default 0, the full throttle).
#   bash bench/straggler.sh BIN_DIR [OUT_DIR]    (STEPS=120 by default)
# Needs taskset (util-linux) and two cores.
set -euo pipefail
bin=${1:?usage: straggler.sh BIN_DIR [OUT_DIR]}
out=${2:-$(mktemp -d /tmp/dynmo-straggler.XXXXXX)}
steps=${STEPS:-120}
repeats=${REPEATS:-3}
mkdir -p "$out"
. "$(dirname "$0")/local_ranks.sh"

model=(--pp=2 --layers=8 --hidden=128 --heads=4 --seq_len=64 --micro_batch=4
       --microbatches=8 --intra_op_threads=1 --timeout_s=120 --steps="$steps")

trap throttle_off EXIT

# run NAME FLAGS...: rank r pinned to core r.
run() {
  local name=$1 port r pids=()
  shift
  port=$(free_port)
  for r in 0 1; do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port DYNMO_COORDINATOR=none \
      taskset -c $r "$bin/dynmo-train" "${model[@]}" --log_json="$out/$name.jsonl" "$@" \
      > "$out/$name.rank$r.out" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
}

summary() {  # NAME...
  python3 - "$out" "$@" <<'PY'
import json, sys, statistics
out, names = sys.argv[1], sys.argv[2:]
for n in names:
    recs = [json.loads(l) for l in open(f"{out}/{n}.jsonl") if l.strip()]
    half = recs[len(recs) // 2:]
    tps = statistics.median(r["tokens_per_s"] for r in half)
    # After the last plan applied (its epoch), skipping two iterations.
    settled = [r for r in recs if r["epoch"] == recs[-1]["epoch"]][2:]
    steady = statistics.median(r["tokens_per_s"] for r in settled) if settled else float("nan")
    print(f"{n:22s} {tps:9.0f} tok/s (last half)  {steady:9.0f} tok/s (after the last plan, "
          f"{len(settled)} it)  final split {','.join(map(str, recs[-1]['boundaries']))}"
          f"  epochs {recs[-1]['epoch']}")
PY
}

echo "== throttled: rank 1's core shared with a busy loop =="
throttle_on 1
run static-balanced --initial_boundaries=0,5,10
for cut in 4 6 7 8; do
  run "static-$cut" --initial_boundaries=0,$cut,10
done
run dynmo --initial_boundaries=0,5,10 --coordinator=embedded --job=straggler
best=$(python3 "$(dirname "$0")/straggler_pairs.py" --best "$out" static-4 static-6 static-7 static-8)
best=${best#static-}
pairs=("static-$best:dynmo")
# The first pair ran static first; the next runs DynMo first, and so on
# (ABBA), so a drift of the machine's speed over the invocation favours
# neither side of the median.
for i in $(seq 2 "$repeats"); do
  if (( i % 2 == 0 )); then
    run "dynmo-$i" --initial_boundaries=0,5,10 --coordinator=embedded --job="straggler-$i"
    run "static-$best-$i" --initial_boundaries="0,$best,10"
  else
    run "static-$best-$i" --initial_boundaries="0,$best,10"
    run "dynmo-$i" --initial_boundaries=0,5,10 --coordinator=embedded --job="straggler-$i"
  fi
  pairs+=("static-$best-$i:dynmo-$i")
done
throttle_off
echo "== unthrottled =="
run dynmo-unthrottled --initial_boundaries=0,5,10 --coordinator=embedded --job=calm
run static-unthrottled --initial_boundaries=0,5,10

summary static-balanced static-4 static-6 static-7 static-8 dynmo dynmo-unthrottled \
  static-unthrottled
grep -h "rank_speed\|plan_applied" "$out"/dynmo.rank0.out "$out"/dynmo-unthrottled.rank0.out \
  | cut -c1-200 | sed 's/^/  /' | head -20 || true
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
def losses(n):
    return [json.loads(l)["loss"] for l in open(f"{out}/{n}.jsonl") if l.strip()]
same = losses("dynmo") == losses("static-balanced")
print("losses dynmo vs static-balanced (throttled):", "identical" if same else "DIFFER")
PY
echo "== dynmo against the best static split (0,$best,10), pairs run back to back =="
python3 "$(dirname "$0")/straggler_pairs.py" "$out" "${pairs[@]}"
echo "logs: $out"
