#!/usr/bin/env bash
# Coverage-guided fuzzing of the coordinator's job state machine and request
# validators (tests/fuzz/job_state_fuzz_target.cc) with clang's libFuzzer
# and AddressSanitizer, in a build tree of its own (build-fuzz/; no
# LibTorch). Runs for SECONDS (default 60) on both cores' worth of one
# process (seed FUZZ_SEED, default 1; the corpus in build-fuzz/corpus grows
# from run to run); a crash leaves its reproducer in build-fuzz/crashes/, which the
# ordinary build's driver replays:
#   build/bin/dynmo-fuzz-job-state build-fuzz/crashes/crash-...
#
#   bash scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ is needed (apt install clang)" >&2; exit 2; }
flags="-fsanitize=fuzzer-no-link,address -fno-omit-frame-pointer -g -O1"
# DYNMO_CC_LAUNCHER: a compiler launcher (ccache, a slot wrapper), if any.
launcher=()
[ -n "${DYNMO_CC_LAUNCHER:-}" ] && launcher=(-DCMAKE_C_COMPILER_LAUNCHER="$DYNMO_CC_LAUNCHER"
  -DCMAKE_CXX_COMPILER_LAUNCHER="$DYNMO_CC_LAUNCHER" -DCMAKE_CXX_LINKER_LAUNCHER="$DYNMO_CC_LAUNCHER")
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address" \
  -DDYNMO_LIBFUZZER=ON -DDYNMO_BUILD_BENCH=OFF >/dev/null
cmake --build build-fuzz --target dynmo-libfuzz-job-state -j "${JOBS:-2}"
mkdir -p build-fuzz/corpus build-fuzz/crashes
build-fuzz/bin/dynmo-libfuzz-job-state -max_total_time="$seconds" -seed="${FUZZ_SEED:-1}" -max_len=4096 \
  -artifact_prefix=build-fuzz/crashes/ -print_final_stats=1 build-fuzz/corpus
