#!/usr/bin/env bash
# The GPU check: builds DynMo on a GPU machine that has PyTorch, CUDA's nvcc,
# CMake and g++ but no package registry, and reports what works there, all
# in one file, $OUT/gpu-check.txt (build-gpu/out/ when OUT is unset), with
# nvidia-smi at the top. Run from the repository root on that machine, with
# build-gpu-kit/ (made here by scripts/gpu-kit.sh) beside the tree.
#
#  1. unpacks every .deb of build-gpu-kit/ into a private prefix,
#     build-gpu/prefix (gRPC, Protobuf, Abseil, prometheus-cpp, GoogleTest,
#     Benchmark, gloo's headers, ninja), and points CMake, pkg-config, the
#     compiler, the linker and the loader at it;
#  2. configures build-gpu/ against the machine's own LibTorch (python3's
#     torch) and builds everything with all cores;
#  3. runs the CUDA tests, then the whole ctest suite;
#  4. trains with dynmo-train: 1 rank on CUDA, 2 ranks (pp=2, gloo) on CUDA
#     and on CPU, a forced layer migration, a re-pack by the test policy and
#     one by the coordinator, NCCL when it was built; compares the losses;
#  5. runs the CSR SpMM kernel benchmark.
# A failing step is recorded as FAIL and the rest still runs; the exit
# status is non-zero when any step failed.
#
# On the lent GPU machine (at most 600 s per command) it runs as TWO calls
# on the same warm machine, each finishing within 590 s (a step that would
# overrun is cut to the time left, or skipped and reported as such):
#   bash scripts/gpu-check.sh build    # 1-2: unpack, configure, build
#   bash scripts/gpu-check.sh test     # 3-5: tests, training runs, figures
# (the test call reuses build-gpu/ and the prefix the build call left).
#
#   bash scripts/gpu-check.sh [build | test | --configure-only | --runs-only]
#       [--skip-full-ctest] [--build-dir=DIR] [--torch-dir=DIR] [--kit=DIR]
#       [-- EXTRA CMAKE ARGS]
#
# With no mode it runs everything in one call (no time limit of its own).
# --configure-only stops after CMake's configure step and the check that
# CMake took every package from the private prefix, with the system's
# packages under /usr hidden from CMake (it runs on any machine: the ctest
# tools.GpuKitConfigures); --build-only is `build`; --runs-only does only
# the training runs and the benchmark with the binaries already in the
# build folder. --torch-dir gives Torch_DIR instead of asking python3.
# DYNMO_GPU_NCCL=0 leaves NCCL out (default: use the nvidia-nccl wheel's).
# DYNMO_GPU_CHECK_SECONDS=N cuts a two-call mode's 590 s to N (both calls
# in one command when the lease is short); DYNMO_GPU_BUILD_TARGETS="a b"
# builds only those targets; DYNMO_GPU_CTEST_REGEX=RE makes the test call
# run only `ctest -R RE` (and nothing after it) in the kit's library
# environment — a ctest run by hand there cannot load the kit's libraries.
# The test call also measures the per-layer
# clocks' cost (scripts/gpu-clock-overhead.sh).
# Functions run through step, which shellcheck does not follow:
# shellcheck disable=SC2317,SC1091
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD

mode=all
full_ctest=1
build="build-gpu"
kit="build-gpu-kit"
torch_dir=
extra=()
while (($#)); do
  arg=$1
  shift
  case $arg in
    --) extra=("$@"); break ;;
    --configure-only) mode=configure ;;
    build | --build-only) mode=build ;;
    test) mode="test" ;;
    --runs-only) mode=runs ;;
    --skip-full-ctest) full_ctest=0 ;;
    --build-dir=*) build=${arg#*=} ;;
    --torch-dir=*) torch_dir=${arg#*=} ;;
    --kit=*) kit=${arg#*=} ;;
    -h | --help) sed -n '2,/^# Functions run/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done
case $build in /*) ;; *) build=$root/$build ;; esac
case $kit in /*) ;; *) kit=$root/$kit ;; esac
prefix=$build/prefix
lib=$prefix/usr/lib/x86_64-linux-gnu
bin=$build/bin
logs=$build/logs
runs=$build/runs
out=${OUT:-$build/out}
report=$out/gpu-check.txt
rm -rf "$logs" "$runs"
mkdir -p "$out" "$logs" "$runs" || exit 1
: >"$report"

# python3 as the machine has it: the prefix's libraries stay out of it.
py() { env -u LD_LIBRARY_PATH -u LIBRARY_PATH -u CPATH python3 "$@"; }
say() { printf '%s\n' "$*" | tee -a "$report"; }
# A section of the report: a title, then the command's output.
section() {
  local title=$1; shift
  { echo; echo "=== $title"; "$@" 2>&1; } | tee -a "$report"
}

results=()
failures=0
# The two-call modes end within 590 s of the start: each step's timeout is
# cut to what is left.
deadline=
case $mode in build | "test") deadline=$((SECONDS + ${DYNMO_GPU_CHECK_SECONDS:-590})) ;; esac
# T=SECONDS TAIL=LINES step NAME CMD...: runs CMD (a program under a timeout,
# or a function of this script) with its output in $logs/NAME.log, records
# PASS or FAIL, and copies the log's last TAIL lines (80 on failure) into
# the report.
step() {
  local name=$1; shift
  local log=$logs/$name.log t0=$SECONDS rc status
  local T=${T:-300}
  if [ -n "$deadline" ]; then
    local left=$((deadline - SECONDS))
    if ((left < 15)); then
      skip "$name" "no time left in this call's 590 s"
      return 0
    fi
    ((T > left)) && T=$left
  fi
  say ""
  say "=== $name: $*"
  if declare -F "$1" >/dev/null; then
    "$@" >"$log" 2>&1
  else
    timeout -k 10 "$T" "$@" >"$log" 2>&1
  fi
  rc=$?
  status=PASS
  if ((rc != 0)); then
    status=FAIL
    failures=$((failures + 1))
  fi
  tail -n "$([ "$status" = PASS ] && echo "${TAIL:-25}" || echo 80)" "$log" |
    sed 's/^/    /' >>"$report"
  local note=
  ((rc == 124 || rc == 137)) && note=", timed out after ${T}s"
  say "--- $name: $status (exit $rc$note, $((SECONDS - t0))s; full log $log)"
  results+=("$(printf '%-4s  %-22s %5ss' "$status" "$name" "$((SECONDS - t0))")")
  return "$rc"
}
skip() {
  say ""
  say "=== $1: SKIP ($2)"
  results+=("$(printf '%-4s  %-22s %6s  %s' SKIP "$1" "" "$2")")
}
finish() {
  say ""
  say "=== summary: $failures failed"
  printf '%s\n' "${results[@]}" | tee -a "$report"
  tar -czf "$out/gpu-check-logs.tar.gz" -C "$build" logs runs 2>/dev/null
  say "report: $report; logs: $out/gpu-check-logs.tar.gz"
  ((failures == 0))
  exit
}

# --- the machine -----------------------------------------------------------
say "DynMo GPU check, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), mode $mode"
say "tree: $(git -C "$root" describe --always --dirty 2>/dev/null || echo 'no git metadata')"
if [ "$mode" != configure ]; then
  T=60 TAIL=40 step nvidia-smi nvidia-smi
fi
machine() {
  echo "host: $(uname -srm), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
  echo "os: $(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-?}")"
  echo "glibc: $(ldd --version 2>&1 | head -1)"
  echo "c++: $(c++ --version 2>&1 | head -1)"
  echo "cmake: $(cmake --version 2>&1 | head -1)"
  echo "nvcc: $( (nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>/dev/null | tail -1 || echo none)"
  echo "torch: $(py -c 'import torch; c = torch.cuda.is_available(); print(torch.__version__, "cuda", torch.version.cuda, "available" if c else "NOT available", torch.cuda.get_device_name(0) if c else "")' 2>&1 | tail -1)"
}
section machine machine
if [ -f "$kit/MANIFEST.tsv" ]; then
  say "kit: $(wc -l <"$kit/MANIFEST.tsv") packages, $(du -sh "$kit" | cut -f1) in $kit"
fi

# --- 1. the private prefix ---------------------------------------------------
extract() {  # extract DEB: dpkg-deb where there is one, else ar + tar
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$1" "$prefix"
  else
    local member z=()
    member=$(ar t "$1" | grep '^data\.tar') || return 1
    case $member in *.xz) z=(-J) ;; *.gz) z=(-z) ;; *.zst) z=(--zstd) ;; esac
    ar p "$1" "$member" | tar -x "${z[@]}" -f - -C "$prefix"
  fi
}
unpack() {
  shopt -s nullglob
  local debs=("$kit"/*.deb) d l t so sys base
  shopt -u nullglob
  if ((${#debs[@]} == 0)); then
    echo "no .deb in $kit: run 'bash scripts/gpu-kit.sh' where Debian's registry is, and carry build-gpu-kit"
    return 1
  fi
  rm -rf "$prefix"
  mkdir -p "$prefix"
  for d in "${debs[@]}"; do extract "$d" || { echo "cannot unpack $d"; return 1; }; done
  echo "unpacked ${#debs[@]} packages into $prefix"
  # Some Debian 12 packages still install into /lib: merge it into usr/.
  for d in lib lib64 bin sbin; do
    if [ -d "$prefix/$d" ] && [ ! -L "$prefix/$d" ]; then
      mkdir -p "$prefix/usr/$d"
      cp -a "$prefix/$d/." "$prefix/usr/$d/"
      rm -rf "${prefix:?}/$d"
    fi
  done
  # Absolute symbolic links (libz.so -> /lib/...) point into the prefix.
  while IFS= read -r -d '' l; do
    t=$(readlink "$l")
    case $t in
      /lib/* | /lib64/* | /bin/* | /sbin/*) ln -sfn "$prefix/usr$t" "$l" ;;
      /*) ln -sfn "$prefix$t" "$l" ;;
    esac
  done < <(find "$prefix" -type l -print0)
  # CMake configs and pkg-config files that name /usr name the prefix.
  local p
  p=$(printf '%s' "$prefix" | sed 's/[#&\\]/\\&/g')
  find "$prefix" -name '*.cmake' -print0 | xargs -0 -r grep -lZ '/usr' |
    xargs -0 -r sed -i -E "s#([\"' ;(=])/usr([/\"' ;)]|\$)#\\1$p/usr\\2#g"
  find "$prefix" -name '*.pc' -print0 | xargs -0 -r grep -lZ '/usr' |
    xargs -0 -r sed -i -E "s#(^|[=\" ]|-I|-L)/usr(/|\$|[ \"])#\\1$p/usr\\2#g"
  echo "configs pointing at $prefix/usr: $(grep -rl "$prefix/usr" --include='*.cmake' --include='*.pc' "$prefix" | wc -l)"
  # Where the machine has these general-purpose libraries itself, its copies
  # (as new or newer, and what its own programs load) win over the kit's:
  # an older libssl or libz on LD_LIBRARY_PATH could break cmake or curl.
  for so in libssl.so.3 libcrypto.so.3 libz.so.1 libcurl.so.4; do
    sys=$(ldconfig -p 2>/dev/null | awk -v s="$so" '$1 == s && $NF !~ /^\/.*\/prefix\// { print $NF; exit }')
    if [ -z "$sys" ] || [ ! -e "$lib/$so" ]; then continue; fi
    base=${so%%.so.*}.so
    rm -f "$lib/$so" "$lib/$so".*
    [ -L "$lib/$base" ] && ln -sfn "$sys" "$lib/$base"
    echo "the machine's $so ($sys) serves instead of the kit's"
  done
}
if [[ $mode == test || $mode == runs ]] && [ -d "$prefix/usr" ]; then
  skip unpack "the prefix the build call unpacked: $prefix"
else
  T=300 TAIL=20 step unpack unpack || finish
fi

export PATH="$prefix/usr/bin:$PATH"
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LIBRARY_PATH="$lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
# gloo's headers (torch's ProcessGroupGloo.hpp includes them) and the rest.
export CPATH="$prefix/usr/include:$prefix/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}"
export PKG_CONFIG_PATH="$lib/pkgconfig:$prefix/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"

tools() {
  local rc=0 f
  echo "protoc: $(protoc --version)" || rc=1
  echo "ninja: $(ninja --version)" || rc=1
  echo "pkg-config re2/grpc++/protobuf: $(pkg-config --modversion re2 grpc++ protobuf | tr '\n' ' ')" || rc=1
  for f in "$prefix/usr/bin/protoc" "$prefix/usr/bin/grpc_cpp_plugin" "$lib"/libgrpc++.so.1.51 "$lib"/libprotobuf.so.32; do
    if ldd "$f" | grep 'not found'; then echo "$f: libraries missing (above)"; rc=1; fi
  done
  command -v protoc grpc_cpp_plugin ninja pkg-config
  return "$rc"
}
T=60 TAIL=10 step tools tools

# --- 2. configure and build --------------------------------------------------
if [ -z "$torch_dir" ]; then
  torch_prefix=$(py -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
  [ -n "$torch_prefix" ] && torch_dir=$torch_prefix/Torch
fi
cmake_args=(-S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
  "-DCMAKE_MAKE_PROGRAM=$(command -v ninja)"
  "-DCMAKE_PREFIX_PATH=$prefix/usr;$lib/cmake${torch_dir:+;$(dirname "$torch_dir")}"
  "-DProtobuf_ROOT=$prefix/usr" "-DOPENSSL_ROOT_DIR=$prefix/usr"
  "-DZLIB_ROOT=$prefix/usr" "-DCURL_ROOT=$prefix/usr")
[ -n "$torch_dir" ] && cmake_args+=("-DTorch_DIR=$torch_dir")
# Every package with a CMake config, named outright: nothing from /usr.
for pkg in absl:absl gRPC:grpc prometheus-cpp:prometheus-cpp GTest:GTest \
  benchmark:benchmark civetweb:civetweb spdlog:spdlog fmt:fmt; do
  [ -d "$lib/cmake/${pkg#*:}" ] && cmake_args+=("-D${pkg%%:*}_DIR=$lib/cmake/${pkg#*:}")
done
[ -d "$prefix/usr/share/cmake/nlohmann_json" ] &&
  cmake_args+=("-Dnlohmann_json_DIR=$prefix/usr/share/cmake/nlohmann_json")
# --configure-only proves the kit is whole: the system's packages are hidden
# (every CMake package config under /usr from find_package, and pkg-config's
# own search path), so a package missing from the kit fails the configure
# or the cache check (every package's path inside the prefix) fails: with
# libspdlog-dev taken out of the kit, CMake 3.25 still found /usr's spdlog
# config and the cache check failed the run (the ctest
# tools.GpuKitConfigures). The C library's headers stay: the toolchain's.
if [ "$mode" = configure ]; then
  hidden=()
  for d in /usr/lib/x86_64-linux-gnu/cmake/* /usr/lib/cmake/* /usr/share/cmake/* \
    /usr/lib/x86_64-linux-gnu/cmake/*/* /usr/lib/cmake/*/*; do
    [ -d "$d" ] && hidden+=("$d")
  done
  cmake_args+=("-DCMAKE_IGNORE_PATH=$(IFS=';'; echo "${hidden[*]}")")
  export PKG_CONFIG_LIBDIR=$PKG_CONFIG_PATH
fi
cmake_args+=("${extra[@]}")
# NCCL's header from the nvidia-nccl wheel torch runs on, when the CUDA
# toolkit has none (trainer/CMakeLists.txt looks for nccl.h; libtorch_cuda
# brings the library).
if [ "${DYNMO_GPU_NCCL:-1}" != 0 ] && [ "$mode" != configure ]; then
  nccl=$(py -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
  if [ -n "$nccl" ] && [ -e "$nccl/include/nccl.h" ]; then
    cmake_args+=("-DDYNMO_NCCL_INCLUDE_DIR=$nccl/include")
  fi
fi

configure() {
  if [ -z "$torch_dir" ]; then
    echo "no Torch_DIR (python3 has no torch, no --torch-dir): LibTorch parts are left out"
  fi
  echo "cmake ${cmake_args[*]}"
  cmake "${cmake_args[@]}"
}
# Each package the build needs must come from the private prefix.
check_cache() {
  local cache=$build/CMakeCache.txt bad=0 key val where
  for key in absl_DIR gRPC_DIR prometheus-cpp_DIR GTest_DIR benchmark_DIR \
    nlohmann_json_DIR civetweb_DIR spdlog_DIR fmt_DIR Protobuf_INCLUDE_DIR Protobuf_LIBRARY_RELEASE \
    Protobuf_PROTOC_EXECUTABLE Protobuf_PROTOC_LIBRARY_RELEASE \
    c-ares_INCLUDE_DIR c-ares_LIBRARY RE2_PREFIX pkgcfg_lib_RE2_re2 \
    OPENSSL_INCLUDE_DIR ZLIB_INCLUDE_DIR CURL_INCLUDE_DIR; do
    val=$(grep -m1 "^$key:" "$cache" | cut -d= -f2-)
    if [ -z "$val" ] || [[ $val == *-NOTFOUND ]]; then
      printf '%-34s (not found; the build does not use it)\n' "$key"
      continue
    fi
    case $val in
      "$prefix"/*) where=prefix ;;
      *) where='OUTSIDE THE PREFIX'; bad=1 ;;
    esac
    printf '%-34s %s  [%s]\n' "$key" "$val" "$where"
  done
  for key in Torch_DIR CMAKE_CUDA_COMPILER DYNMO_NCCL_INCLUDE_DIR CMAKE_CXX_COMPILER; do
    printf '%-34s %s\n' "$key" "$(grep -m1 "^$key:" "$cache" | cut -d= -f2-)"
  done
  grep -E 'kernels: |dynmo-train: ' "$logs/configure.log"
  return "$bad"
}
if [[ $mode == runs || $mode == test ]]; then
  skip configure "$mode: the binaries already in $bin"
else
  T=600 TAIL=30 step configure configure || finish
  T=60 TAIL=40 step cmake-cache check_cache
  [ "$mode" = configure ] && finish
  # DYNMO_GPU_BUILD_TARGETS="a b": only those targets (a short re-check).
  read -r -a targets <<<"${DYNMO_GPU_BUILD_TARGETS:-}"
  T=3600 TAIL=15 step build cmake --build "$build" -j "$(nproc)" \
    ${targets[@]:+--target "${targets[@]}"}
  [ "$mode" = build ] && finish
fi
if [ "$mode" != runs ]; then

  # --- 3. tests --------------------------------------------------------------
  if [ -n "${DYNMO_GPU_CTEST_REGEX:-}" ]; then
    # A short re-check of some tests, with the kit's libraries on the
    # loader's path (a plain ctest there cannot load them).
    T=600 TAIL=40 step ctest-only ctest --test-dir "$build" -R "$DYNMO_GPU_CTEST_REGEX" \
      -j "$(nproc)" --output-on-failure --no-tests=error
    finish
  fi
  T=600 TAIL=40 step ctest-cuda ctest --test-dir "$build" -R 'cuda|Cuda|CUDA|gpu|Gpu' \
    --output-on-failure --no-tests=error
  if ((full_ctest)); then
    # Leaves the training runs and figures ~150 s of a two-call test.
    all_t=1800
    [ -n "$deadline" ] && all_t=$((deadline - SECONDS - 150))
    # The deploy tests that run Debian's prometheus and promtool are left
    # out: the GPU machine has no package registry and CI runs them.
    T=$all_t TAIL=40 step ctest-all ctest --test-dir "$build" -j "$(nproc)" \
      --output-on-failure -E '^deploy_(prometheus_rules|dashboard_live)$'
  else
    skip ctest-all "--skip-full-ctest"
  fi
fi

# --- 4. training runs ----------------------------------------------------------
help=$("$bin/dynmo-train" --helpfull 2>&1 || true)
if grep -q -- '--device' <<<"$help"; then
  cuda=(--device=cuda)
  cpu=(--device=cpu)
  dev=cuda
else
  cuda=()
  cpu=()
  dev=cpu
  say ""
  say "=== dynmo-train has no --device flag: the CUDA runs are skipped, the multi-rank runs train on CPU"
fi
job=(--pp=2 --layers=8 --backend=gloo)
steps=(--steps=20)
# train NAME [launcher flags --] trainer flags: one run, its records in $runs.
train() {
  local name=$1; shift
  local launch=()
  if [ "$1" = launch ]; then
    shift
    while [ "$1" != -- ]; do launch+=("$1"); shift; done
    shift
    launch=("$bin/dynmo-launch" "${launch[@]}" --)
  fi
  rm -f "$runs/$name.jsonl"
  T=300 TAIL=8 step "$name" "${launch[@]}" "$bin/dynmo-train" "$@" --log_json="$runs/$name.jsonl"
}
pairs=()
if [ "$dev" = cuda ]; then
  train cuda-pp1 --layers=8 --steps=20 "${cuda[@]}"
  pairs+=(cuda-pp1:cpu-pp2)
  # A pruned model on the GPU: each matrix times masked dense (cuBLAS) vs
  # LibTorch's sparse CSR (cuSPARSE) and logs its choice ("forms timed").
  T=300 TAIL=12 step cuda-prune "$bin/dynmo-train" --layers=4 --hidden=512 --heads=8 \
    --seq_len=128 --steps=8 --dynamism=pruning --prune_start=3 --prune_end=3 \
    --prune_every=1 --prune_final_sparsity=0.95 "${cuda[@]}"
else
  skip cuda-pp1 "dynmo-train has no --device"
fi
train "$dev-pp2" launch --nproc 2 -- "${job[@]}" "${steps[@]}" "${cuda[@]}"
[ "$dev" = cuda ] && train cpu-pp2 launch --nproc 2 -- "${job[@]}" "${steps[@]}" "${cpu[@]}" &&
  pairs+=(cuda-pp2:cpu-pp2)
train "$dev-migrate" launch --nproc 2 -- "${job[@]}" "${steps[@]}" "${cuda[@]}" \
  --test_migrate_every=2 '--test_migration_boundaries=0,4,10;0,6,10'
pairs+=("$dev-migrate:$dev-pp2")
# Re-packing (tests/trainer/dynmo_train_repack_test.cc): the test policy
# keeps stage 1 alone from iteration 3, then the coordinator's own plan.
train "$dev-repack" launch --nproc 2 -- "${job[@]}" "${steps[@]}" "${cuda[@]}" \
  --test_migrate_every=3 --test_migration_boundaries=1@0,10
pairs+=("$dev-repack:$dev-pp2")
train "$dev-repack-coord" launch --nproc 2 --job=repack -- "${job[@]}" "${cuda[@]}" \
  --steps=30 --trigger=every:3 --repack --repack_tolerance=10
pairs+=("$dev-repack-coord:$dev-pp2")
# NCCL refuses two ranks on one GPU: it runs at world size 1 here (the
# world all-reduces), next to the Gloo run of the same job.
if [ "$dev" = cuda ]; then
  train nccl-pp1 --layers=8 --steps=20 --backend=nccl "${cuda[@]}"
  pairs+=(nccl-pp1:cuda-pp1)
else
  skip nccl-pp1 "dynmo-train has no --device"
fi

# What the per-layer CUDA-event clocks cost (with and without, alternated,
# 3 runs each: one pair is noise; target <= 2%).
if [ "$dev" = cuda ]; then
  T=200 TAIL=20 step clock-overhead bash "$root/scripts/gpu-clock-overhead.sh" "$bin" \
    "$runs/overhead" 3 20
fi

# The Python adapter (dynmo.pipelining) under torch.distributed.pipelining
# on CUDA: one rank (NCCL refuses two ranks on one GPU, Gloo sends only CPU
# tensors), static and with the embedded coordinator; the losses must agree.
pipelining() {
  local name=$1; shift
  rm -f "$runs/$name.jsonl"
  T=240 TAIL=8 step "$name" env PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" \
    DYNMO_BIN_DIR="$bin" OMP_NUM_THREADS=1 python3 -m torch.distributed.run --standalone \
    --nproc-per-node=1 "$root/examples/torch/llama_pipelining.py" --pp=1 --steps=20 \
    --device="$dev" --log_json="$runs/$name.jsonl" "$@"
}
pipelining "py-$dev-static" --coordinator=none
pipelining "py-$dev-dynmo" --coordinator=embedded --trigger=every:3 && pairs+=("py-$dev-dynmo:py-$dev-static")

# Losses per run, and each pair's agreement over the iterations both ran.
compare_losses() {
  py "$root/scripts/gpu-loss-table.py" "$runs" 1e-2 "${pairs[@]}"
}
TAIL=40 step losses compare_losses

# --- 5. the kernel benchmark -------------------------------------------------
benches=()
for b in "$bin"/dynmo-bench-kernels*; do [ -x "$b" ] && benches+=("$b"); done
if ((${#benches[@]})); then
  for b in "${benches[@]}"; do
    T=300 TAIL=60 step "$(basename "$b")" "$b" --benchmark_min_time=0.05
  done
else
  skip bench-kernels "no dynmo-bench-kernels in $bin"
fi

finish
