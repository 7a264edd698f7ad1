#!/usr/bin/env bash
# The main job, side by side: one GPT training job (2 pipeline stages, 10
# pipeline layers, layer freezing on) run three times on this machine's two
# cores, each rank pinned to its own core:
#   static     from a badly skewed partition (0,9,10: 9 of 10 layers on
#              stage 0), no coordinator;
#   dynmo      the same start with DynMo: dynmo-launch's embedded
#              coordinator re-balances it live from the measured per-layer
#              times (the `auto` trigger: a plan only when its predicted gain
#              clears the noise and pays back the move), and again when
#              freezing removes the front layers' backward pass midway;
#   best       static again, at the partition that is best in hindsight (the
#              exact time-optimal split of the static run's mean measured
#              layer times, from dynmo-plan).
# The losses are identical (migration is lossless). It prints the table
# (tokens/s, imbalance, bubble ratio, plans, bytes moved, final loss) and
# draws out/main-job.svg (per-stage time per iteration, plans and model
# changes marked); the per-iteration records are out/main-{static,dynmo,
# best}.jsonl, and `scripts/dynmo-report` redraws any of them. Each run's
# timeline (the first 60 iterations: per-layer forward and backward slices
# per stage, plans and model changes marked) is out/main-*.perfetto.json:
# open it at https://ui.perfetto.dev (Open trace file) or chrome://tracing.
# STEPS (default 120) sets the run length; extra arguments go to dynmo-train.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
torch_args="$(bash scripts/cmake-torch-args.sh)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$torch_args" >/dev/null
cmake --build build --target dynmo-launch dynmo-train dynmo-plan
mkdir -p out
steps="${STEPS:-120}"
job=(--pp=2 --layers=8 --hidden=128 --heads=4 --seq_len=64 --micro_batch=4
     --microbatches=8 --steps="$steps" --seed=7 --lr=0.003 --intra_op_threads=1
     --layer_clock=cpu --log_interval=10
     --dynamism=freezing --freeze_every=5 --freeze_window=1
     --freeze_threshold=0.6 --freeze_max_layers=5)
# One core per rank: LOCAL_RANK picks it.
pin=(sh -c 'exec taskset -c "$LOCAL_RANK" "$@"' pinned)

run() {  # NAME COORDINATOR BOUNDARIES [dynmo-train flags...]
  local name=$1 coordinator=$2 boundaries=$3
  shift 3
  echo "== $name: boundaries $boundaries, coordinator $coordinator =="
  build/bin/dynmo-launch --nproc 2 --coordinator "$coordinator" --job "main-$name" -- \
    "${pin[@]}" build/bin/dynmo-train "${job[@]}" --initial_boundaries="$boundaries" \
    --log_json="out/main-$name.jsonl" "$@"
}

rm -f out/main-static.jsonl out/main-dynmo.jsonl out/main-best.jsonl
run static none 0,9,10 "$@"
run dynmo embedded 0,9,10 --balancer=time --trigger=auto "$@"
# The best static split in hindsight: the time-optimal one of the static
# run's mean per-layer times (warm-up iterations left out).
best=$(python3 - out/main-static.jsonl <<'EOF' | build/bin/dynmo-plan --method time | python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["boundaries"])))'
import json, sys
records = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][2:]
n = len(records[0]["layer_forward_s"])
times = [sum(r["layer_forward_s"][l] + r["layer_backward_s"][l] for r in records) / len(records)
         for l in range(n)]
print(json.dumps({"stages": 2, "layers": [{"time": t, "params": 1, "mem_bytes": 0} for t in times]}))
EOF
)
run best none "$best" "$@"
echo
python3 scripts/dynmo-report --svg out/main-job.svg \
  "static (0,9,10)=out/main-static.jsonl" "DynMo (0,9,10)=out/main-dynmo.jsonl" \
  "best static ($best)=out/main-best.jsonl"
for name in static dynmo best; do
  python3 python/dynmo/perfetto.py "out/main-$name.jsonl" "out/main-$name.perfetto.json" --count 60
done
echo "timelines: out/main-{static,dynmo,best}.perfetto.json (open at https://ui.perfetto.dev)"
