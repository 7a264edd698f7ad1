#!/usr/bin/env bash
# tools.GpuKitConfigures: the GPU kit (scripts/gpu-kit.sh) cannot rot again.
#  1. every package scripts/install-deps.sh builds with is in the kit's
#     roots, or named below as one the GPU machine brings or never needs;
#  2. the kit is made (or refreshed when gpu-kit.sh is newer than it);
#  3. scripts/gpu-check.sh --configure-only configures the project from the
#     kit's prefix with the system's packages under /usr hidden from CMake,
#     and checks every package came from the prefix.
# Exits 77 (ctest: skipped) only when the kit cannot be downloaded (no
# Debian registry reachable); any other failure fails the test.
#   gpu_kit_configure_test.sh SOURCE_DIR WORK_DIR TORCH_DIR
set -uo pipefail
src=$1 work=$2 torch_dir=$3

# Brought by the GPU machine (toolchain, CMake, Python), or used only by
# what never runs there (the Prometheus server of a demo, the fuzzer).
not_in_kit=" build-essential cmake pkg-config openssl prometheus python3 python3-yaml
  python3-venv python3-dev clang libclang-rt-14-dev "
deps=$(sed -n '/^packages=(/,/^)/p' "$src/scripts/install-deps.sh" | grep -v '^ *#' |
  tr ' ()' '\n\n\n' | grep -E '^[a-z0-9][a-z0-9.+-]+$' | grep -v '^packages=$')
roots=$(sed -n '/^roots=(/,/^)/p' "$src/scripts/gpu-kit.sh" | tr ' ()' '\n\n\n')
missing=0
for p in $deps; do
  [[ $not_in_kit == *" $p "* || $not_in_kit == *" $p"$'\n'* ]] && continue
  grep -qx -- "$p" <<<"$roots" && continue
  echo "FAIL: scripts/install-deps.sh builds with $p, which scripts/gpu-kit.sh does not carry"
  missing=1
done
((missing)) && exit 1
echo "kit roots cover install-deps.sh"

kit=$src/build-gpu-kit
if [ ! -f "$kit/MANIFEST.tsv" ] || [ "$src/scripts/gpu-kit.sh" -nt "$kit/MANIFEST.tsv" ]; then
  if ! bash "$src/scripts/gpu-kit.sh" >"$work.kit.log" 2>&1; then
    tail -5 "$work.kit.log"
    if grep -qiE 'temporary failure|could not resolve|unable to fetch|failed to fetch|no such host' "$work.kit.log"; then
      echo "SKIP: the kit cannot be downloaded here (no Debian registry reachable)"
      exit 77
    fi
    echo "FAIL: scripts/gpu-kit.sh failed (log $work.kit.log)"
    exit 1
  fi
fi
rm -rf "$work"
OUT=$work/out bash "$src/scripts/gpu-check.sh" --configure-only --build-dir="$work" \
  --torch-dir="$torch_dir"
rc=$?
sed -n '/=== cmake-cache/,/--- cmake-cache/p' "$work/out/gpu-check.txt"
exit "$rc"
