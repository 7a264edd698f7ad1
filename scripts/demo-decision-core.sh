#!/usr/bin/env bash
# The decision core on its own, no training: build its tools, re-balance the shipped
# example pipeline, re-pack it, and replay two dynamic-model scenarios (layer
# freezing and early exit, 48 layers on 4 stages) static vs DynMo through the
# simulator, with a Gantt chart of a pipeline in out/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build --target dynmo-plan dynmo-sim
mkdir -p out
echo "== dynmo-plan --method optimal examples/problem.json"
build/bin/dynmo-plan --method optimal examples/problem.json
echo "== dynmo-plan --method optimal --repack --tolerance 0.2 examples/problem.json"
build/bin/dynmo-plan --method optimal --repack --tolerance 0.2 examples/problem.json
echo "== dynmo-sim --schedule 1f1b --microbatches 8 --stage-times ... --svg out/1f1b.svg"
build/bin/dynmo-sim --schedule 1f1b --microbatches 8 \
  --stage-times 0.028:0.056:0.028,0.026:0.052:0.026,0.027:0.054:0.027,0.019:0.037:0.019 \
  --svg out/1f1b.svg
echo "== dynmo-sim --scenario freezing --stages 4 --trigger on-change --bandwidth 25e9"
build/bin/dynmo-sim --scenario freezing --stages 4 --balancer optimal --trigger on-change --bandwidth 25e9
echo "== dynmo-sim --scenario early-exit --stages 4 --trigger every:10 --bandwidth 25e9"
build/bin/dynmo-sim --scenario early-exit --stages 4 --balancer optimal --trigger every:10 --bandwidth 25e9
echo "Gantt chart written to out/1f1b.svg"
