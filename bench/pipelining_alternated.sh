#!/usr/bin/env bash
# DynMo under torch.distributed.pipelining against the best static split,
# its arms alternated in every order, so that a machine that drifts under
# single runs weighs on each arm alike. The job and flags are
# bench/pipelining_side_by_side.sh's (examples/torch/llama_pipelining.py,
# 2 pipeline ranks under torchrun, each pinned to its own core, Gloo, 8
# blocks = 10 pipeline layers, 80 iterations, freezing). Three arms:
#   S   static BEST (default 0,5,10: the best split in every earlier
#       invocation) without a coordinator;
#   D0  DynMo embedded (trigger auto) from BEST: nothing to move;
#   D9  DynMo embedded from START (default 0,9,10), which it must re-split.
# ROUNDS (default 3) rounds, round k starting at arm k mod 3 (S D0 D9,
# D0 D9 S, D9 S D0, ...). Prints per round each arm's tokens/s (median over
# iterations 2..) and D9/S, D0/S, their medians, each D9 run's plans, and
# whether every run's losses match S's round by round (D9's from START are
# compared with a static START run only by the side-by-side script).
#
#   bash bench/pipelining_alternated.sh [BUILD_DIR] [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/local_ranks.sh
build="${1:-build}"
out="${2:-out/alternated}"
example_env "$build"
rounds="${ROUNDS:-3}"
best="${BEST:-0,5,10}"
start="${START:-0,9,10}"
mkdir -p "$out"
job=(--schedule "${SCHEDULE:-1F1B}" --steps "${STEPS:-80}" --layers 8 --dim 128 --seq_len 64
     --microbatches 8 --micro_batch 4 --dynamism "${DYNAMISM:-freezing}")
arm() {  # ARM ROUND
  local name="$1-$2"
  case $1 in
    S) flags=(--initial_boundaries "$best" --coordinator none) ;;
    D0) flags=(--initial_boundaries "$best" --coordinator embedded --trigger auto) ;;
    D9) flags=(--initial_boundaries "$start" --coordinator embedded --trigger auto) ;;
  esac
  echo "== $name" >&2
  pinned_example "$venv" "$out/$name.log" "${job[@]}" "${flags[@]}" \
    --log_json "$out/$name.jsonl"
}
arms=(S D0 D9)
for r in $(seq 1 "$rounds"); do
  for k in 0 1 2; do
    arm "${arms[$(((r - 1 + k) % 3))]}" "$r"
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def load(name):
    return [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
def rate(recs):  # as scripts/dynmo-report: median tokens/s over iterations 2..
    return statistics.median(r["tokens_per_s"] for r in recs[2:])
print("| round (order) | S tok/s | D0 tok/s | D9 tok/s | D9 / S | D0 / S | D9's plans |")
print("|---|---|---|---|---|---|---|")
d9s, d0s, same = [], [], True
orders = ["S D0 D9", "D0 D9 S", "D9 S D0"]
for r in range(1, rounds + 1):
    s, d0, d9 = (load(f"{a}-{r}") for a in ("S", "D0", "D9"))
    same = same and [x["loss"] for x in d0] == [x["loss"] for x in s]
    plans, last = [], d9[0]["boundaries"]
    for x in d9:
        if x["boundaries"] != last:
            plans.append(f"{','.join(map(str, x['boundaries']))}@{x['iteration']}")
            last = x["boundaries"]
    d9s.append(rate(d9) / rate(s))
    d0s.append(rate(d0) / rate(s))
    print(f"| {r} ({orders[(r - 1) % 3]}) | {rate(s):,.0f} | {rate(d0):,.0f} | {rate(d9):,.0f} | "
          f"{d9s[-1]:.3f} | {d0s[-1]:.3f} | {' '.join(plans) or 'none'} |")
print(f"D9 / S median {statistics.median(d9s):.3f}x (lowest {min(d9s):.3f}, highest "
      f"{max(d9s):.3f}); D0 / S median {statistics.median(d0s):.3f}x; "
      f"D0's losses identical to S's in every round: {same}")
PY
