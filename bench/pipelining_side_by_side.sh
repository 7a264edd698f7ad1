#!/usr/bin/env bash
# DynMo under torch.distributed.pipelining, side by side on this machine:
# examples/torch/llama_pipelining.py (a torchtitan-layout Llama, 2 pipeline
# ranks under torchrun, each pinned to its own core, Gloo) run
#   static     from a skewed split (default 0,9,10: the embedding and all 8
#              blocks on rank 0, the head alone on rank 1), no coordinator;
#   dynmo      the same start with the embedded coordinator (trigger auto,
#              its default), which re-splits the running job live;
# then static from DynMo's final split and its neighbours (the best static
# split in hindsight, HINDSIGHT=1 by default) and PAIRS (default 3) pairs of
# that best split against DynMo, the first pair the runs above, the others
# run back to back with their order alternating (DynMo first in the even
# ones): the paired ratios and their median (bench/straggler_pairs.py, a
# run's rate its median tokens/s over all but its 2 warm-up iterations;
# target 0.98x), since single runs here drift by more than the gap, and
# each DynMo plan's predicted and realized gain (the embedded coordinator's
# log, out/pipelining-*.coordinator.log); then the overhead A/B of DynMo's
# per-layer hooks: the static run with and without them, alternated REPS
# times (default 3) in this one invocation.
# The dynamic case (DYNAMISM, default freezing) changes per-layer cost while
# it runs. Prints the table (scripts/dynmo-report: tokens/s, imbalance,
# bubble, plans, bytes moved, final loss — identical) and draws
# out/pipelining.svg; records: out/pipelining-*.jsonl.
#
#   bash bench/pipelining_side_by_side.sh [BUILD_DIR] [extra example flags...]
#
# Needs BUILD_DIR (default build) to hold the dynmo Python package and
# dynmo-coordinator (ninja -C build dynmo_python dynmo-coordinator) and the
# torch venv of scripts/install-torch.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/local_ranks.sh
build="${1:-build}"
shift || true
venv="$(bash scripts/install-torch.sh | tail -n 1)"
export PYTHONPATH="$PWD/$build/python" DYNMO_BIN_DIR="$PWD/$build/bin" OMP_NUM_THREADS=1
steps="${STEPS:-80}"
start="${START:-0,9,10}"
reps="${REPS:-3}"
pairs_n="${PAIRS:-3}"
mkdir -p out
job=(--schedule "${SCHEDULE:-1F1B}" --steps "$steps" --layers 8 --dim 128 --seq_len 64
     --microbatches 8 --micro_batch 4 --initial_boundaries "$start"
     --dynamism "${DYNAMISM:-freezing}")

run() {  # NAME [example flags...]
  local name=$1
  shift
  echo "== $name" >&2
  # The embedded coordinator's event log (plans, their predicted and
  # realized gains) is kept beside the records.
  rm -f "out/pipelining-$name.coordinator.log"
  DYNMO_COORDINATOR_LOG="out/pipelining-$name.coordinator.log" \
    pinned_example "$venv" "out/pipelining-$name.log" "${job[@]}" \
    --log_json "out/pipelining-$name.jsonl" "$@"
}

run static --coordinator none "$@"
run dynmo --coordinator embedded --trigger auto "$@"
echo
python3 scripts/dynmo-report --svg out/pipelining.svg \
  "static ($start)=out/pipelining-static.jsonl" "DynMo ($start)=out/pipelining-dynmo.jsonl"
python3 - out/pipelining-static.jsonl out/pipelining-dynmo.jsonl <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:3])
print(f"losses identical over {len(a)} iterations: {a == b}")
PY

# The best static split in hindsight, in this invocation: static from
# DynMo's final split and its neighbours (one layer either way on a 2-rank
# split), each run like the first static one; DynMo against the fastest.
# HINDSIGHT=0 leaves it out.
if [ "${HINDSIGHT:-1}" = 1 ]; then
  final=$(python3 -c 'import json,sys; print(",".join(map(str, [json.loads(l) for l in open(sys.argv[1])][-1]["boundaries"])))' out/pipelining-dynmo.jsonl)
  tried=()
  IFS=, read -r -a b <<<"$final"
  if [ "${#b[@]}" = 3 ]; then
    for k in $((b[1] - 1)) "${b[1]}" $((b[1] + 1)); do
      ((k > b[0] && k < b[2])) || continue
      split="${b[0]},$k,${b[2]}"
      [ "$split" = "$start" ] && continue  # the static run above
      job_split=("${job[@]/$start/$split}")
      echo "== hindsight-$k ($split)" >&2
      pinned_example "$venv" "out/pipelining-hindsight-$k.log" "${job_split[@]}" \
        --coordinator none --log_json "out/pipelining-hindsight-$k.jsonl" "$@"
      tried+=("out/pipelining-hindsight-$k.jsonl")
    done
  fi
  python3 - out/pipelining-static.jsonl out/pipelining-dynmo.jsonl "${tried[@]}" <<'PY'
import os, sys
sys.path.insert(0, "bench")
from straggler_pairs import records, rate as median_rate
def rate(path):  # median tokens/s over iterations 2.. (as scripts/dynmo-report)
    recs = records(path)
    return median_rate(recs, 2), recs
(static, s), (dynmo, _) = rate(sys.argv[1]), rate(sys.argv[2])
best, split, same, name = static, s[0]["boundaries"], True, sys.argv[1]
for p in sys.argv[3:]:
    r, recs = rate(p)
    same = same and [x["loss"] for x in recs] == [x["loss"] for x in s]
    print(f"static {','.join(map(str, recs[0]['boundaries']))}: {r:,.0f} tok/s")
    if r > best:
        best, split, name = r, recs[0]["boundaries"], p
print(f"best static split in hindsight: {','.join(map(str, split))} at {best:,.0f} tok/s; "
      f"DynMo {dynmo:,.0f}: {dynmo / best:.3f}x of it; losses of every static split "
      f"identical: {same}")
# For the pairs below: the best run's name and split.
with open("out/pipelining-hindsight-best", "w") as f:
    print(os.path.basename(name)[:-len(".jsonl")], ",".join(map(str, split)), file=f)
PY
  # DynMo against that best split, pair after pair (ABBA): the first pair
  # is the runs above; a drift of the machine over the invocation then
  # favours neither side of the median.
  read -r best best_split < out/pipelining-hindsight-best
  job_best=("${job[@]/$start/$best_split}")
  run_best() {  # I [example flags...]: static at the best split
    local i=$1
    shift
    echo "== best-$i ($best_split)" >&2
    pinned_example "$venv" "out/pipelining-best-$i.log" "${job_best[@]}" \
      --coordinator none --log_json "out/pipelining-best-$i.jsonl" "$@"
  }
  pairs=("$best:pipelining-dynmo")
  for i in $(seq 2 "$pairs_n"); do
    if (( i % 2 == 0 )); then
      run "dynmo-$i" --coordinator embedded --trigger auto "$@"
      run_best "$i" "$@"
    else
      run_best "$i" "$@"
      run "dynmo-$i" --coordinator embedded --trigger auto "$@"
    fi
    pairs+=("pipelining-best-$i:pipelining-dynmo-$i")
  done
  echo "== DynMo against the best static split in hindsight ($best_split), pairs back to back =="
  python3 bench/straggler_pairs.py --skip 2 --target 0.98 out "${pairs[@]}"
fi

# The hooks' overhead: the same static job with and without DynMo's
# per-layer timing, alternated so both see the same machine.
ab=()
for i in $(seq 1 "$reps"); do
  run "hooks-on-$i" --coordinator none "$@"
  run "hooks-off-$i" --coordinator none --no_timing "$@"
  ab+=("out/pipelining-hooks-on-$i.jsonl" "out/pipelining-hooks-off-$i.jsonl")
done
python3 - "${ab[@]}" <<'PY'
import json, statistics, sys
def iteration_s(path):  # median iteration time, warm-up (2) left out
    return statistics.median(json.loads(l)["iteration_s"] for l in list(open(path))[2:])
on = [iteration_s(p) for p in sys.argv[1::2]]
off = [iteration_s(p) for p in sys.argv[2::2]]
print("hooks on  (s/iteration, per pair):", " ".join(f"{x:.4f}" for x in on))
print("hooks off (s/iteration, per pair):", " ".join(f"{x:.4f}" for x in off))
print(f"overhead of the per-layer hooks: {100 * (statistics.median(on) / statistics.median(off) - 1):+.1f}% "
      f"(median of {len(on)} pairs)")
PY
