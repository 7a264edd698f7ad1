#!/usr/bin/env bash
# Prints the CMake arguments that point the build at the LibTorch of
# scripts/install-torch.sh (installing it first when missing): one
# -DTorch_DIR=... argument. Sourced by test.sh and run-main.sh.
set -euo pipefail
venv="$(bash "$(dirname "$0")/install-torch.sh" | tail -n 1)"
torch_dir="$("$venv/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')/Torch"
echo "-DTorch_DIR=$torch_dir"
