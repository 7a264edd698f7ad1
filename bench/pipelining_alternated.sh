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
#   D9  DynMo embedded from START (default 0,9,10), which it must re-split
#       (its plan agreement the default "auto": started a boundary early);
#   B9  (with ARMS="S D0 D9 B9") D9 with --plan_agreement boundary.
# ROUNDS (default 3) rounds, round k starting at arm k mod N of the N arms
# (S D0 D9, D0 D9 S, D9 S D0, ...). Prints per round each arm's tokens/s (median over
# iterations 2..) and D9/S, D0/S, their medians, each D9 run's plans, and
# whether every run's losses match S's round by round (D9's from START are
# compared with a static START run only by the side-by-side script), then
# every plan's predicted and realized gain (the embedded coordinator's
# plan_realized events, in OUT_DIR/<arm>-<round>.coordinator.log) and the
# median absolute prediction error.
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
    B9) flags=(--initial_boundaries "$start" --coordinator embedded --trigger auto
               --plan_agreement boundary) ;;
    *) echo "pipelining_alternated: unknown arm $1" >&2; exit 2 ;;
  esac
  echo "== $name" >&2
  DYNMO_COORDINATOR_LOG="$out/$name.coordinator.log" \
    pinned_example "$venv" "$out/$name.log" "${job[@]}" "${flags[@]}" \
    --log_json "$out/$name.jsonl"
}
read -r -a arms <<< "${ARMS:-S D0 D9}"
n=${#arms[@]}
for r in $(seq 1 "$rounds"); do
  for k in $(seq 0 $((n - 1))); do
    arm "${arms[$(((r - 1 + k) % n))]}" "$r"
  done
done
python3 - "$out" "$rounds" "${arms[@]}" <<'PY'
import json, statistics, sys
out, rounds, arms = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def load(name):
    return [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
def rate(recs):  # as scripts/dynmo-report: median tokens/s over iterations 2..
    return statistics.median(r["tokens_per_s"] for r in recs[2:])
sys.path.insert(0, "bench")
import straggler_pairs
others = [a for a in arms if a != "S"]
movers = [a for a in others if a != "D0"]
print("| round (order) | " + " | ".join(f"{a} tok/s" for a in arms) + " | "
      + " | ".join(f"{a} / S" for a in others) + " | "
      + " | ".join(f"{a}'s plans" for a in movers) + " |")
print("|---" * (len(arms) + len(others) + len(movers)) + "|")
ratio = {a: [] for a in others}
same, runs = True, []
for r in range(1, rounds + 1):
    order = " ".join(arms[(r - 1 + k) % len(arms)] for k in range(len(arms)))
    recs = {a: load(f"{a}-{r}") for a in arms}
    rates = {a: rate(recs[a]) for a in arms}
    if "D0" in recs:
        same = same and [x["loss"] for x in recs["D0"]] == [x["loss"] for x in recs["S"]]
    plans = []
    for a in movers:
        got, last = [], recs[a][0]["boundaries"]
        for x in recs[a]:
            if x["boundaries"] != last:
                got.append(f"{','.join(map(str, x['boundaries']))}@{x['iteration']}")
                last = x["boundaries"]
        plans.append(" ".join(got) or "none")
    for a in others:
        ratio[a].append(rates[a] / rates["S"])
        runs.append(f"{a}-{r}")
    print(f"| {r} ({order}) | " + " | ".join(f"{rates[a]:,.0f}" for a in arms) + " | "
          + " | ".join(f"{ratio[a][-1]:.3f}" for a in others) + " | "
          + " | ".join(plans) + " |")
for a in others:
    print(f"{a} / S median {statistics.median(ratio[a]):.3f}x (lowest {min(ratio[a]):.3f}, "
          f"highest {max(ratio[a]):.3f})")
print(f"D0's losses identical to S's in every round: {same}")
print()
straggler_pairs.plan_gains(out, runs)
PY
