#!/usr/bin/env bash
# What DynMo costs the pipelining adapter when there is nothing to move:
# examples/torch/llama_pipelining.py (2 pipeline ranks under torchrun,
# Gloo, each pinned to its own core, no throttle), static at the balanced
# split 0,5,10 against DynMo embedded (trigger auto, speed probe, agents,
# reports) from the same split, REPEATS pairs (default 3) run back to back
# and alternated. Prints each pair's rates (median tokens/s over the last
# half of the iterations, bench/straggler_pairs.py), the paired ratios and
# their median, the plans DynMo applied (none expected) and whether the
# losses are identical.
#
#   bash bench/idle_overhead_pipelining.sh [BUILD_DIR]    (STEPS=120, REPEATS=3)
#
# Needs BUILD_DIR (default build) to hold the dynmo Python package and
# dynmo-coordinator, the torch venv of scripts/install-torch.sh, taskset
# and two otherwise idle cores.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/local_ranks.sh
build="${1:-build}"
venv="$(bash scripts/install-torch.sh | tail -n 1)"
export PYTHONPATH="$PWD/$build/python" DYNMO_BIN_DIR="$PWD/$build/bin" OMP_NUM_THREADS=1
steps="${STEPS:-120}"
repeats="${REPEATS:-3}"
out="${OUT:-out/idle-overhead-pipelining}"
mkdir -p "$out"
job=(--schedule 1F1B --steps "$steps" --layers 8 --dim 128 --seq_len 64
     --microbatches 8 --micro_batch 4 --initial_boundaries 0,5,10)

run() {  # NAME [example flags...]
  local name=$1
  shift
  echo "== $name" >&2
  pinned_example "$venv" "$out/$name.log" "${job[@]}" --log_json "$out/$name.jsonl" "$@"
}

pairs=()
for i in $(seq 1 "$repeats"); do
  if (( i % 2 )); then
    run "static-$i" --coordinator none
    run "dynmo-$i" --coordinator embedded --trigger auto
  else
    run "dynmo-$i" --coordinator embedded --trigger auto
    run "static-$i" --coordinator none
  fi
  pairs+=("static-$i:dynmo-$i")
done
"$venv/bin/python" bench/straggler_pairs.py "$out" "${pairs[@]}"
"$venv/bin/python" - "$out" "$repeats" <<'PY'
import sys
sys.path.insert(0, "bench")
from straggler_pairs import records
out, n = sys.argv[1], int(sys.argv[2])
for i in range(1, n + 1):
    s, d = records(f"{out}/static-{i}.jsonl"), records(f"{out}/dynmo-{i}.jsonl")
    same = [r["loss"] for r in s] == [r["loss"] for r in d]
    epochs = sorted({r["epoch"] for r in d})
    print(f"pair {i}: losses {'identical' if same else 'DIFFER'}; dynmo's plans: "
          f"{len(epochs) - 1}; final split {','.join(map(str, d[-1]['boundaries']))}")
PY
echo "records: $out"
