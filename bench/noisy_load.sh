#!/usr/bin/env bash
# Another process's load on both cores, a job whose best split does not
# change (issue 44): two dynmo-train ranks (8 blocks from 0,5,10, not
# pinned) with the embedded coordinator's defaults (auto trigger), while two
# busy loops share both cores; STEPS iterations. Prints the plans applied
# (iteration, split) and how many of them went back to the split an earlier
# plan had left within 50 iterations (the target: none).
#
#   bash bench/noisy_load.sh BIN_DIR [OUT_DIR]      # STEPS=200 by default
set -euo pipefail
bin=${1:?usage: noisy_load.sh BIN_DIR [OUT_DIR]}
out=${2:-$(mktemp -d /tmp/dynmo-noisy.XXXXXX)}
steps=${STEPS:-200}
mkdir -p "$out"
. "$(dirname "$0")/local_ranks.sh"
# The busy loops are grandchildren (their subshell exits at once), so that
# run_ranks' wait does not wait for them.
: >"$out/loops.pid"
trap 'kill $(cat "$out/loops.pid") 2>/dev/null || true' EXIT
for _ in 0 1; do
  (bash -c 'while :; do :; done' & echo $! >>"$out/loops.pid")
done
run_ranks "$bin" 2 "$out" --pp=2 --layers=8 --hidden=128 --heads=4 --seq_len=64 \
  --micro_batch=4 --microbatches=8 --intra_op_threads=1 --timeout_s=600 --steps="$steps" \
  --initial_boundaries=0,5,10 --coordinator=embedded --job=noisy \
  --log_json="$out/noisy.jsonl"
kill $(cat "$out/loops.pid") 2>/dev/null || true
python3 - "$out/noisy.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
splits, prev = [], None
for r in recs:
    b = tuple(r["boundaries"])
    if b != prev:
        splits.append((r["iter"], b))
        prev = b
plans = splits[1:]
reversals = sum(1 for i in range(1, len(splits)) for j in range(i + 1, len(splits))
                if splits[j][0] - splits[i][0] <= 50 and splits[j][1] == splits[i - 1][1])
print(f"{len(recs)} iterations; plans applied: {len(plans)} "
      + " ".join(f"{','.join(map(str, b))}@{it}" for it, b in plans))
print(f"reversals within 50 iterations: {reversals}")
PY
