#!/usr/bin/env bash
# Real trainer processes through the node relay vs direct sessions:
# dynmo-launch runs 8 dynmo-train ranks (pp 4 x dp 2, a small GPT on CPU,
# a skewed start 0,7,8,9,10) with the embedded coordinator, once with the
# node relay (the default: one HostSession for the 8 ranks) and once with
# --relay=false (8 Sessions), the same seed and trigger. Prints, per mode,
# the plans the ranks applied (iteration, epoch, boundaries), the final loss
# and the throughput.
#
#   bash bench/relay_trainer.sh [BUILD_BIN_DIR] [STEPS]   (default build/bin, 60)
set -euo pipefail
bin="${1:-build/bin}"
steps="${2:-60}"
work="$(mktemp -d /tmp/dynmo-relay-bench.XXXXXX)"
trap 'rm -rf "$work"' EXIT
job=(--pp=4 --dp=2 --layers=8 --hidden=64 --heads=4 --seq_len=32 --micro_batch=2
     --microbatches=4 --steps="$steps" --seed=7 --intra_op_threads=1
     --log_interval=10 --initial_boundaries=0,7,8,9,10 --balancer=time
     --trigger=every:20)
for relay in true false; do
  "$bin/dynmo-launch" --nproc 8 --relay="$relay" --job "relay-$relay" -- \
      "$bin/dynmo-train" "${job[@]}" > "$work/$relay.log" 2>&1
  echo "== relay=$relay =="
  grep -E "node relay|event=plan_|event=repack|applied plan|done," "$work/$relay.log" | sed 's/^/  /'
done
