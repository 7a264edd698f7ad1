#!/usr/bin/env bash
# The six dynamic-model cases (MoD twice: top-k and predictor routing),
# static vs DynMo, measured (issue 5's benchmark; results in
# docs/benchmarks.md, "Dynamic-model cases").
#
# mod-predictor is mod with --mod_routing=predictor: the tokens a MoD block
# runs are those its causal predictor picks, so the load moves as the
# predictor learns (rank 0 prints "mod: tokens run by blocks ..." at each
# move, reported as "model changed": hence the on-event trigger). The
# early-exit case runs CALM's recipe: exited tokens cost only their keys
# and values in later blocks.
#
# For every case: a CPU run at pp=2 (two dynmo-train ranks under
# dynmo-launch, one intra-op thread each) with the static partition
# (--coordinator=none) and the same run with DynMo (embedded coordinator,
# time balancer); each summarised by bench/dynamism_summary.py (tokens/s,
# measured bubble ratio, time in iterations that applied a plan beyond the
# median). The static run also records its per-layer trace (--trace), which
# dynmo-sim replays stretched to the paper's scale (48 layers, 24 stages,
# 1F1B, 96 micro-batches) static vs dynamic (optimal balancer, every 10
# iterations: a structural imbalance such as MoD's never "drifts", so
# on-change would never fire).
#
#   bash bench/dynamism_bench.sh [BIN_DIR] [CASE...]   # default: build/bin, all seven
# Outputs land in out/bench-dynamism/. Needs a quiet machine: both ranks
# share the cores, so other load distorts the stage times.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/bin}
shift || true
CASES=("$@")
[ ${#CASES[@]} -gt 0 ] || CASES=(moe pruning freezing sparse-attention early-exit mod mod-predictor)
OUT=out/bench-dynamism
mkdir -p "$OUT"

COMMON="--pp=2 --layers=8 --intra_op_threads=1 --log_interval=1000"
declare -A FLAGS TRIGGER STEPS
FLAGS[moe]="--hidden=64 --heads=4 --seq_len=64 --micro_batch=4 --microbatches=4 \
  --dynamism=moe --moe_experts=4 --moe_every=1 --moe_first=5"
TRIGGER[moe]="every:4"; STEPS[moe]=40
FLAGS[pruning]="--hidden=64 --heads=4 --seq_len=32 --vocab=512 --micro_batch=4 \
  --microbatches=4 --lr=0.003 --seed=5 --dynamism=pruning --prune_start=4 \
  --prune_end=4 --prune_every=1 --prune_final_sparsity=0.9"
TRIGGER[pruning]="on-event"; STEPS[pruning]=40
FLAGS[freezing]="--hidden=128 --heads=4 --seq_len=64 --micro_batch=4 --microbatches=8 \
  --lr=0.01 --seed=7 --dynamism=freezing --freeze_every=2 --freeze_window=1 \
  --freeze_threshold=100 --freeze_max_layers=5"
TRIGGER[freezing]="on-event"; STEPS[freezing]=30
FLAGS[sparse-attention]="--hidden=32 --heads=2 --seq_len=512 --micro_batch=2 \
  --microbatches=4 --dynamism=sparse-attention --attention_block=32 \
  --attention_buckets=8 --attention_every=1 --attention_first=5"
TRIGGER[sparse-attention]="every:4"; STEPS[sparse-attention]=30
FLAGS[early-exit]="--hidden=128 --heads=4 --seq_len=64 --micro_batch=4 --microbatches=8 \
  --lr=0.01 --seed=7 --dynamism=early-exit --exit_after=2 --exit_threshold=0 \
  --exit_warmup_iters=4"
TRIGGER[early-exit]="on-event"; STEPS[early-exit]=30
FLAGS[mod]="--hidden=128 --heads=4 --seq_len=128 --micro_batch=4 --microbatches=4 \
  --dynamism=mod --mod_capacity=0.125 --mod_every=1 --mod_first=5"
TRIGGER[mod]="every:4"; STEPS[mod]=30
# lr 3e-4: at the default 1e-3 AdamW's first steps swing the predictor's
# logits for whole sequences at once, so a block's routed fraction flips
# between 0 and 1 from one iteration to the next.
FLAGS[mod-predictor]="${FLAGS[mod]} --mod_routing=predictor --lr=3e-4"
TRIGGER[mod-predictor]="on-event"; STEPS[mod-predictor]=40

run() {  # run NAME EXTRA_FLAGS...
  local name=$1; shift
  # shellcheck disable=SC2086
  "$BIN/dynmo-launch" --nproc 2 --coordinator none -- "$BIN/dynmo-train" \
    $COMMON "$@" --log_json="$OUT/$name.jsonl" > "$OUT/$name.log" 2>&1
}

for c in "${CASES[@]}"; do
  [ -n "${FLAGS[$c]:-}" ] || { echo "unknown case '$c'" >&2; exit 2; }
  rm -f "$OUT/$c-static.jsonl" "$OUT/$c-dynmo.jsonl" "$OUT/$c.trace.jsonl"
  # shellcheck disable=SC2086
  run "$c-static" ${FLAGS[$c]} --steps="${STEPS[$c]}" --coordinator=none \
    --trace="$OUT/$c.trace.jsonl"
  # shellcheck disable=SC2086
  run "$c-dynmo" ${FLAGS[$c]} --steps="${STEPS[$c]}" --coordinator=embedded \
    --balancer=time --trigger="${TRIGGER[$c]}"
  static=$(python3 bench/dynamism_summary.py "$OUT/$c-static.jsonl" --skip 4)
  dynmo=$(python3 bench/dynamism_summary.py "$OUT/$c-dynmo.jsonl" --skip 4)
  sim=$("$BIN/dynmo-sim" --trace "$OUT/$c.trace.jsonl" --layers 48 --stages 24 \
    --schedule 1f1b --microbatches 96 --balancer optimal --trigger every:10)
  python3 - "$c" "$static" "$dynmo" "$sim" <<'PY'
import json, sys
case, static, dynmo, sim = sys.argv[1], *map(json.loads, sys.argv[2:])
print(json.dumps({"case": case,
                  "cpu_pp2": {"static": static, "dynmo": dynmo,
                              "speedup": dynmo["tokens_per_s"] / static["tokens_per_s"]},
                  "sim_48x24": {k: sim[k] for k in ("speedup", "rebalances",
                                                    "mean_imbalance", "mean_bubble_ratio")}}))
PY
done | tee "$OUT/summary.jsonl"
