#!/usr/bin/env bash
# The test command: install what is missing (Debian packages; PyPI's torch
# 2.11 in a reused venv, scripts/install-torch.sh), configure, build
# everything, run every test under ctest, then 60 s of coverage-guided
# fuzzing (scripts/fuzz.sh). CI (.ci/run) runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
torch_args="$(bash scripts/cmake-torch-args.sh)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$torch_args"
cmake --build build -j "$(nproc)"
ctest --test-dir build --output-on-failure -j "$(nproc)"
# Coverage-guided fuzzing of the request validators and the job state
# machine (clang's libFuzzer + ASan, build-fuzz/) for a bounded 60 s; a
# crash fails the run and leaves its reproducer in build-fuzz/crashes/.
JOBS="$(nproc)" bash scripts/fuzz.sh 60
