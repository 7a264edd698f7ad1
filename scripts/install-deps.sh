#!/usr/bin/env bash
# Installs the Debian 12 packages DynMo builds and tests against, only when
# some are missing (so a machine that has them needs no root and no network).
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config
  libabsl-dev nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  prometheus-cpp-dev prometheus openssl
  # libspdlog-dev: the coordinator's event log (coordinator/service/event_log.h).
  libspdlog-dev
  # python3-dev: the headers dynmo._core (python/) is compiled against.
  python3 python3-yaml python3-venv python3-dev
  libgloo-dev
  # clang + its runtime (libclang_rt.fuzzer, ASan): scripts/fuzz.sh, the
  # bounded coverage-guided run scripts/test.sh ends with.
  clang libclang-rt-14-dev
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
