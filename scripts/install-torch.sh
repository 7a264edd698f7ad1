#!/usr/bin/env bash
# Installs LibTorch as PyPI ships it: torch==2.11.0 (its CUDA 13 build, the
# version the GPU machines run) with pybind11 and pytest, in a virtual
# environment that later runs and fresh clones reuse. Prints the venv's path
# on the last line of stdout; everything else goes to stderr.
#
#   DYNMO_TORCH_VENV   where the venv lives
#                      (default: ${XDG_CACHE_HOME:-~/.cache}/dynmo/venv-torch-2.11.0)
#
# The wheel brings torch's C++ headers, its CMake config
# (share/cmake/Torch) and the CUDA 13 runtime libraries it links against
# (nvidia-* wheels), so CUDA targets link here and run where a GPU is.
set -euo pipefail
torch_version=2.11.0
venv="${DYNMO_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dynmo/venv-torch-${torch_version}}"
stamp="$venv/.dynmo-installed"
want="torch==${torch_version} pybind11 pytest numpy"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "$venv"
  exit 0
fi
echo "install-torch: installing $want into $venv (one time, ~5 GB)" >&2
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv" >&2
# shellcheck disable=SC2086
"$venv/bin/pip" install -q --disable-pip-version-check $want >&2
"$venv/bin/python" -c 'import torch; assert torch.__version__.startswith("'"$torch_version"'"), torch.__version__' >&2
echo "$want" >"$stamp"
echo "$venv"
