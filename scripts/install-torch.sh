#!/usr/bin/env bash
# Installs LibTorch as PyPI ships it: torch==2.11.0 (its CUDA 13 build, the
# version the GPU machines run) with pybind11 and pytest, and the model
# libraries whose own classes tests/python/test_models.py trains under
# dynmo.pipelining (transformers, torchtitan), in a virtual environment that
# later runs and fresh clones reuse. Prints the venv's path on the last line
# of stdout; everything else goes to stderr.
#
#   DYNMO_TORCH_VENV   where the venv lives
#                      (default: ${XDG_CACHE_HOME:-~/.cache}/dynmo/venv-torch-2.11.0)
#
# The wheel brings torch's C++ headers, its CMake config
# (share/cmake/Torch) and the CUDA 13 runtime libraries it links against
# (nvidia-* wheels), so CUDA targets link here and run where a GPU is.
#
# The model libraries, pinned to releases that import beside torch 2.11:
# transformers with the dependencies pip resolves for it (none of them is
# torch); torchtitan 0.2.2 (0.3 needs a newer torch) without its declared
# dependencies (training-loop tooling: datasets, tensorboard, ...), adding
# only the modules `import torchtitan.models.llama3` reaches (its Qwen3 MoE
# reaches no others; Triton comes with the torch wheel), each pinned
# and also without dependencies, so that nothing replaces torch.
set -euo pipefail
torch_version=2.11.0
venv="${DYNMO_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dynmo/venv-torch-${torch_version}}"
stamp="$venv/.dynmo-installed"
base="torch==${torch_version} pybind11 pytest numpy"
models="transformers==5.24.0"
titan="torchtitan==0.2.2 torchdata==0.11.0 tyro==1.0.17 docstring_parser==0.18.0
  tensorboard==2.21.0 protobuf==7.36.2 absl-py==2.5.1 datasets==5.2.0 dill==0.4.1
  multiprocess==0.70.19 xxhash==4.1.0 pandas==3.1.1 python-dateutil==4.0.0 pyarrow==26.0.1"
titan="$(echo $titan)"  # one line: the stamp compares it
want="$base; $models; --no-deps $titan"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "$venv"
  exit 0
fi
echo "install-torch: installing $want into $venv (one time, ~5 GB)" >&2
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv" >&2
pip=("$venv/bin/pip" install -q --disable-pip-version-check)
# shellcheck disable=SC2086
"${pip[@]}" $base >&2
# shellcheck disable=SC2086
"${pip[@]}" "torch==${torch_version}" $models >&2
# shellcheck disable=SC2086
"${pip[@]}" --no-deps $titan >&2
"$venv/bin/python" -c 'import torch; assert torch.__version__.startswith("'"$torch_version"'"), torch.__version__' >&2
"$venv/bin/python" -c 'import torchtitan.models.llama3, torchtitan.models.qwen3, transformers' >&2
echo "$want" >"$stamp"
echo "$venv"
