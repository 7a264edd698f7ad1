#!/usr/bin/env bash
# The main job: a local 4-rank pipeline-parallel GPT training run on CPU,
# started by dynmo-launch with its embedded coordinator. The run starts from a
# badly skewed partition (7 of the 10 pipeline layers on stage 0); every rank
# reports its per-layer times, the coordinator re-balances every 3 iterations
# and the ranks move layers (weights and AdamW state) while training goes on.
# Watch the "applied plan" lines and the stage times and imbalance even out.
# Extra arguments go to dynmo-train (e.g. --steps=100).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build --target dynmo-launch dynmo-train
mkdir -p out
build/bin/dynmo-launch --nproc 4 -- build/bin/dynmo-train \
  --pp=4 --layers=8 --initial_boundaries=0,7,8,9,10 \
  --balancer=time --trigger=every:3 --steps=40 --log_interval=5 \
  --log_json=out/train.jsonl "$@"
echo "per-iteration records in out/train.jsonl"
