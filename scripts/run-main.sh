#!/usr/bin/env bash
# The main job: a local 4-rank pipeline-parallel GPT training run on CPU,
# started by dynmo-launch with its embedded coordinator. The run starts from a
# badly skewed partition (7 of the 10 pipeline layers on stage 0); every rank
# reports its per-layer times, the coordinator re-balances every 3 iterations
# and the ranks move layers (weights and AdamW state) while training goes on.
# The model changes under it too: layer freezing (Egeria-like) freezes the
# front layers once their measured plasticity falls below 0.6 (around
# iteration 20), their backward disappears, and DynMo re-balances again.
# Watch the "applied plan" and "froze layers" lines and the stage times.
# Extra arguments go to dynmo-train (e.g. --steps=100).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
torch_args="$(bash scripts/cmake-torch-args.sh)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$torch_args" >/dev/null
cmake --build build --target dynmo-launch dynmo-train
mkdir -p out
build/bin/dynmo-launch --nproc 4 -- build/bin/dynmo-train \
  --pp=4 --layers=8 --initial_boundaries=0,7,8,9,10 \
  --balancer=time --trigger=every:3 --steps=60 --log_interval=5 \
  --dynamism=freezing --freeze_every=5 --freeze_window=1 \
  --freeze_threshold=0.6 --freeze_max_layers=5 \
  --log_json=out/train.jsonl "$@"
echo "per-iteration records in out/train.jsonl"
