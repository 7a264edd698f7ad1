#!/usr/bin/env bash
# What DynMo costs on a GPU, in one command that fits one device call
# (issue 39, item 6). Run from the repository root on the GPU machine, with
# build-gpu-kit/ (scripts/gpu-kit.sh) carried; everything finishes within
# DYNMO_GPU_OVERHEAD_SECONDS (default 580) of the start:
#
#  0. builds only what it runs (dynmo-train, dynmo-coordinator, the dynmo
#     Python module, dynmo-bench-migration) through `scripts/gpu-check.sh
#     build` (the kit's private prefix, build-gpu/; incremental when a
#     warm machine already has it), then runs with the kit's libraries on
#     the loader's path;
#  1. examples/torch/llama_pipelining.py at the issue's size on one CUDA
#     rank (12 blocks, dim 1024, 16 / 4 heads, seq 512, 8 micro-batches of
#     8 rows, 20 iterations) in three modes, alternated round by round:
#       plain   --coordinator=none --no_timing   PyTorch pipelining alone
#       timing  --coordinator=none               + DynMo's per-layer clocks
#       dynmo   --coordinator=embedded           + agent and coordinator
#  2. dynmo-train at a comparable size (12 blocks, hidden 1024, 16 heads,
#     seq 512, 8 x 8 rows, one CUDA rank), alike:
#       plain   --coordinator=none --profile_layers=false  (one clock per stage pass)
#       timing  --coordinator=none --profile_layers=true
#       dynmo   --coordinator=embedded
#  3. migration bandwidth of one Llama block with its AdamW state (541 MB):
#     bench/migration_bandwidth.py --copy (device->device, device<->host:
#     what one GPU can measure), 2 ranks over Gloo on the CPU (the Python
#     path's host figure), 2 ranks over NCCL when 2 GPUs are visible (NCCL
#     refuses two ranks on one GPU; Gloo cannot send CUDA tensors);
#     dynmo-bench-migration (the C++ trainer's SendLayerState/RecvLayerState
#     over its Gloo transport; that bench has CPU tensors only);
#  4. with the time left, the host syncs of a 10-iteration DynMo run of the
#     adapter, by line (bench/sync_audit.py).
# A run's figure is its median tokens/s over iterations SKIP (5) to the
# last; a mode's, the median over its rounds; "vs plain", the median of its
# ratios to the plain run of the same round. Every run's losses are compared
# with the first plain run's: with nothing to move DynMo changes no
# arithmetic, so they must be identical. Rounds are cut (and said so) when
# the time left cannot hold one and leave the later parts theirs.
#
#   bash bench/gpu_overhead.sh [--kit=DIR] [--build-dir=DIR] [--no-build]
#       [--rounds=N] [--steps=N] [--cpu-smoke [--build]]
#
# --cpu-smoke runs the same script at toy sizes on the CPU (Gloo, 3
# iterations, SKIP 1) against the binaries already in --build-dir (default
# build; no build unless --build), to check its logic on a machine without a
# GPU. PYTHON names the interpreter (default python3, which has torch on
# the GPU machine). Report: $OUT/gpu-overhead.txt (build-gpu/out/ when OUT
# is unset; the smoke run: build/out/), the runs' records and logs in
# $OUT/gpu-overhead-runs/; the tables come last on stdout.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD

smoke=0
do_build=
build=
kit="build-gpu-kit"
rounds=2
steps=
while (($#)); do
  arg=$1
  shift
  case $arg in
    --cpu-smoke) smoke=1 ;;
    --build) do_build=1 ;;
    --no-build) do_build=0 ;;
    --build-dir=*) build=${arg#*=} ;;
    --kit=*) kit=${arg#*=} ;;
    --rounds=*) rounds=${arg#*=} ;;
    --steps=*) steps=${arg#*=} ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_overhead: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

# The sizes. The GPU's are the issue's; the smoke's only exercise the logic.
if ((smoke)); then
  build=${build:-build}
  do_build=${do_build:-0}
  dev=cpu
  steps=${steps:-3}
  skip=1
  adapter_size=(--layers=2 --dim=64 --heads=4 --kv_heads=2 --seq_len=32 --microbatches=2
    --micro_batch=2)
  trainer_size=(--layers=2 --hidden=64 --heads=4 --seq_len=32 --microbatches=2 --micro_batch=2)
  mig_dim=128
  cpp_hidden=64
  mig_reps=2
  run_cap=120
  est_adapter=20 est_trainer=10 mig_reserve=40
else
  build=${build:-build-gpu}
  do_build=${do_build:-1}
  dev=cuda
  steps=${steps:-20}
  skip=5
  adapter_size=(--layers=12 --dim=1024 --heads=16 --kv_heads=4 --seq_len=512 --microbatches=8
    --micro_batch=8)
  trainer_size=(--layers=12 --hidden=1024 --heads=16 --seq_len=512 --microbatches=8
    --micro_batch=8)
  mig_dim=2048
  cpp_hidden=2048
  mig_reps=5
  run_cap=150
  est_adapter=45 est_trainer=40 mig_reserve=70
fi
case $build in /*) ;; *) build=$root/$build ;; esac
case $kit in /*) ;; *) kit=$root/$kit ;; esac
bin=$build/bin
lib=$build/prefix/usr/lib/x86_64-linux-gnu
out=${OUT:-$build/out}
report=$out/gpu-overhead.txt
runs=$out/gpu-overhead-runs
python=${PYTHON:-python3}
rm -rf "$runs"
mkdir -p "$runs" || exit 1
: >"$report"
deadline=$((SECONDS + ${DYNMO_GPU_OVERHEAD_SECONDS:-580}))
left() { echo $((deadline - SECONDS)); }
say() { printf '%s\n' "$*" | tee -a "$report"; }
# python as the machine has it (the kit's libraries stay out of it).
py() { env -u LD_LIBRARY_PATH "$python" "$@"; }

say "DynMo GPU overhead, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $([ "$smoke" = 1 ] && echo 'CPU SMOKE (toy sizes: no figure means anything)' || echo "device $dev")"
say "tree: $(git -C "$root" describe --always --dirty 2>/dev/null || echo 'no git metadata')"
gpus=0
if command -v nvidia-smi >/dev/null; then
  say "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -4 | paste -sd';')"
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
fi
say "torch: $(py -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1); $(nproc) cores"

# --- 0. build only what runs -----------------------------------------------------
targets="dynmo-train dynmo-coordinator dynmo_python dynmo-bench-migration"
have_binaries() {
  [ -x "$bin/dynmo-train" ] && [ -x "$bin/dynmo-coordinator" ] &&
    compgen -G "$build/python/dynmo/_core*.so" >/dev/null
}
if ((do_build)); then
  if ! compgen -G "$kit/*.deb" >/dev/null && have_binaries; then
    say "build: no kit in $kit: the binaries already in $build serve"
  else
    # The runs need about 4 minutes: the build gets the rest.
    t0=$SECONDS
    OUT=$out/build DYNMO_GPU_BUILD_TARGETS="$targets" \
      DYNMO_GPU_CHECK_SECONDS=$(($(left) - 240)) \
      bash "$root/scripts/gpu-check.sh" build --kit="$kit" --build-dir="$build" \
      >"$runs/build.log" 2>&1
    rc=$?
    say "build ($targets): $([ "$rc" = 0 ] && echo PASS || echo "FAIL (exit $rc)") in $((SECONDS - t0)) s; report $out/build/gpu-check.txt"
    sed -n '/^=== summary/,$p' "$out/build/gpu-check.txt" 2>/dev/null | sed 's/^/    /' | tee -a "$report"
  fi
fi
if ! have_binaries; then
  say "FAIL: $bin/dynmo-train, $bin/dynmo-coordinator or $build/python/dynmo/_core*.so missing: nothing to run"
  exit 1
fi
[ -d "$lib" ] && export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" DYNMO_BIN_DIR="$bin" OMP_NUM_THREADS=1
unset DYNMO_COORDINATOR DYNMO_JOB

# run NAME CMD...: one run under a timeout cut to the time left; one line,
# with the run's median tokens/s when it wrote $runs/NAME.jsonl.
last_s=0
failures=0
run() {
  local name=$1 t0=$SECONDS rc t status figure=
  shift
  last_s=0
  t=$(($(left) - 5))
  ((t > run_cap)) && t=$run_cap
  if ((t < 15)); then
    say "  $name: SKIP (no time left)"
    return 1
  fi
  timeout -k 5 "$t" "$@" >"$runs/$name.log" 2>&1
  rc=$?
  last_s=$((SECONDS - t0))
  status=ok
  ((rc != 0)) && status="FAIL (exit $rc)" && failures=$((failures + 1))
  ((rc == 124 || rc == 137)) && status="FAIL (timed out after $t s)"
  if [ -f "$runs/$name.jsonl" ]; then
    figure=", $(py - "$runs/$name.jsonl" "$skip" <<'EOF' 2>&1 | tail -1
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
tps = [r["tokens_per_s"] for r in recs if r["iter"] >= int(sys.argv[2])]
print(f"{statistics.median(tps):,.0f} tok/s over {len(tps)} iterations" if tps
      else "no iterations past the warm-up")
EOF
)"
  fi
  say "  $name: $status, $last_s s$figure"
  if ((rc != 0)); then tail -n 8 "$runs/$name.log" | sed 's/^/      /' | tee -a "$report"; fi
  return "$rc"
}

adapter_cmd=(examples/torch/llama_pipelining.py --pp=1 --device="$dev" "${adapter_size[@]}"
  --steps="$steps")
trainer_cmd=(--pp=1 --device="$dev" "${trainer_size[@]}" --steps="$steps")
adapter() {  # MODE ROUND
  local flags
  case $1 in
    plain) flags=(--coordinator=none --no_timing) ;;
    timing) flags=(--coordinator=none) ;;
    dynmo) flags=(--coordinator=embedded) ;;
  esac
  run "adapter-$1-$2" "$python" -m torch.distributed.run --standalone --nproc-per-node=1 \
    "${adapter_cmd[@]}" "${flags[@]}" --log_json="$runs/adapter-$1-$2.jsonl"
}
trainer() {  # MODE ROUND
  local flags
  case $1 in
    plain) flags=(--coordinator=none --profile_layers=false) ;;
    timing) flags=(--coordinator=none --profile_layers=true) ;;
    dynmo) flags=(--coordinator=embedded) ;;
  esac
  run "trainer-$1-$2" "$bin/dynmo-train" "${trainer_cmd[@]}" "${flags[@]}" \
    --log_json="$runs/trainer-$1-$2.jsonl"
}
# alternate KIND EST RESERVE: up to $rounds rounds of the three modes; a
# round after the first starts only if ~3 runs (the slowest so far) plus
# RESERVE seconds for the later parts still fit.
alternate() {
  local kind=$1 est=$2 reserve=$3 r m slowest
  for ((r = 1; r <= rounds; r++)); do
    if ((r > 1 && $(left) < 3 * est + reserve)); then
      say "  $kind: round $r not started: $(left) s left, a round takes ~$((3 * est)) s and the later parts need ${reserve} s"
      break
    fi
    slowest=0
    for m in plain timing dynmo; do
      "$kind" "$m" "$r"
      ((last_s > slowest)) && slowest=$last_s
    done
    ((slowest > est || r == 1)) && est=$slowest
  done
}

say ""
say "=== 1. the adapter: $python -m torch.distributed.run --standalone --nproc-per-node=1 ${adapter_cmd[*]} + plain | timing | dynmo"
alternate adapter "$est_adapter" $((3 * est_trainer + mig_reserve))
say ""
say "=== 2. dynmo-train: $bin/dynmo-train ${trainer_cmd[*]} + plain | timing | dynmo"
alternate trainer "$est_trainer" "$mig_reserve"

# --- 3. migration bandwidth --------------------------------------------------------
say ""
say "=== 3. migration bandwidth: one Llama block (dim $mig_dim) with its AdamW state"
mig=(bench/migration_bandwidth.py --dim="$mig_dim" --reps="$mig_reps" --json="$runs/migration.jsonl")
run mig-copy "$python" "${mig[@]}" --copy --device="$dev"
run mig-gloo-cpu "$python" -m torch.distributed.run --standalone --nproc-per-node=2 \
  "${mig[@]}" --backend=gloo --device=cpu
if ((gpus >= 2)); then
  run mig-nccl-cuda "$python" -m torch.distributed.run --standalone --nproc-per-node=2 \
    "${mig[@]}" --backend=nccl --device=cuda
else
  say "  mig-nccl-cuda: SKIP ($gpus GPU(s): NCCL refuses two ranks on one GPU)"
fi
if [ -x "$bin/dynmo-bench-migration" ]; then
  run cpp-migration "$bin/dynmo-bench-migration" --hidden "$cpp_hidden" --reps "$mig_reps"
else
  say "  cpp-migration: SKIP (no $bin/dynmo-bench-migration)"
fi
for f in "$runs"/mig-*.log "$runs/cpp-migration.log"; do
  [ -f "$f" ] && grep -h 'GB/s\|refused' "$f" | sed 's/^/    /' | tee -a "$report"
done

# --- 4. the host syncs left ------------------------------------------------------------
# One short DynMo-embedded adapter run under torch.cuda's sync debug mode:
# every synchronizing call, by the line of DynMo's code (and the script's)
# that made it (bench/sync_audit.py). Last: it gets what time is left.
say ""
say "=== 4. host syncs: bench/sync_audit.py ${adapter_cmd[*]} --coordinator=embedded (10 iterations)"
if [ "$dev" = cuda ]; then
  run sync-audit "$python" bench/sync_audit.py --json="$runs/sync-audit.json" \
    "${adapter_cmd[@]/--steps=$steps/--steps=10}" --coordinator=embedded
  sed -n '/^host syncs/,$p' "$runs/sync-audit.log" | tee -a "$report"
else
  say "  sync-audit: SKIP (needs CUDA)"
fi

# --- the tables ------------------------------------------------------------------------
say ""
say "=== summary ($((SECONDS)) s in all)"
py - "$runs" "$skip" "$smoke" <<'EOF' | tee -a "$report"
import glob, json, os, statistics, sys

runs, skip, smoke = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
MODES = ["plain", "timing", "dynmo"]


def records(path):
    try:
        return [json.loads(l) for l in open(path) if l.strip()]
    except OSError:
        return []


def table(kind, title):
    by = {}  # mode -> {round: records}
    for path in glob.glob(os.path.join(runs, f"{kind}-*-*.jsonl")):
        _, mode, rnd = os.path.basename(path)[:-6].rsplit("-", 2)
        recs = records(path)
        if recs:
            by.setdefault(mode, {})[int(rnd)] = recs
    print(f"\n{title}")
    if not by.get("plain"):
        print("  no plain run finished: nothing to compare")
        return
    rounds = sorted({r for m in by.values() for r in m})
    med = {m: {r: statistics.median([x["tokens_per_s"] for x in recs if x["iter"] >= skip] or [0])
               for r, recs in by.get(m, {}).items()} for m in MODES}
    ref_round = min(by["plain"])
    ref = [x["loss"] for x in by["plain"][ref_round]]
    head = "".join(f"{'round ' + str(r):>11}" for r in rounds)
    print(f"  {'mode':<7}{head}{'median':>11}{'vs plain':>10}  per round      losses vs plain round {ref_round}")
    for m in MODES:
        if not med[m]:
            print(f"  {m:<7}(no run finished)")
            continue
        cells = "".join(f"{med[m][r]:>11,.0f}" if r in med[m] else f"{'-':>11}" for r in rounds)
        ratios = [med[m][r] / med["plain"][r] for r in rounds
                  if r in med[m] and r in med["plain"] and med["plain"][r] > 0]
        ratio = f"{statistics.median(ratios):>10.3f}" if ratios else f"{'-':>10}"
        per = " ".join(f"{x:.3f}" for x in ratios)
        verdicts = []
        for r in sorted(by[m]):
            losses = [x["loss"] for x in by[m][r]]
            n = min(len(losses), len(ref))
            diff = max((abs(a - b) for a, b in zip(losses[:n], ref[:n])), default=0.0)
            same = losses[:n] == ref[:n]
            verdicts.append(("identical" if same else f"max |diff| {diff:.2e}")
                            + (f" ({n} its)" if n != len(ref) or len(losses) != len(ref) else ""))
        plans = sum(1 for recs in by[m].values() for x in recs if x.get("plan"))
        moved = sum(x.get("moved_bytes", 0) or 0 for recs in by[m].values() for x in recs)
        extra = f"; {plans} plan(s), {moved / 1e6:.1f} MB moved" if plans or moved else ""
        print(f"  {m:<7}{cells}{statistics.median(med[m].values()):>11,.0f}{ratio}  "
              f"{per:<14} {', '.join(verdicts)}{extra}")
    print(f"  (tokens/s: median over iterations {skip}.. of each run; 'vs plain': median of the "
          f"per-round ratios)")


table("adapter", "adapter: examples/torch/llama_pipelining.py, tokens/s")
table("trainer", "dynmo-train, tokens/s")

print("\nmigration bandwidth (GB/s = 1e9 bytes/s, one way; median of the timed repetitions)")
rows = records(os.path.join(runs, "migration.jsonl"))
for r in rows:
    print(f"  {r['what']:<28} {r['backend']:<6} {r['device']:<5} {r['bytes'] / 1e6:8.1f} MB "
          f"{r['gb_per_s']:8.2f} GB/s")
cpp = [json.loads(l) for l in open(os.path.join(runs, "cpp-migration.log"))
       if l.startswith("{")] if os.path.exists(os.path.join(runs, "cpp-migration.log")) else []
for c in cpp:
    print(f"  {'C++ Send/RecvLayerState':<28} {'gloo':<6} {'cpu':<5} {c['layer_bytes'] / 1e6:8.1f} MB "
          f"{c['migration_bytes_per_s'] / 1e9:8.2f} GB/s  (plain send "
          f"{c['plain_send_bytes_per_s'] / 1e9:.2f} GB/s; hidden {c['hidden']})")
got = {(r["what"], r["backend"], r["device"]): r["gb_per_s"] for r in rows}
d2h = got.get(("copy device->host (pinned)", "-", "cuda"))
h2d = got.get(("copy host->device (pinned)", "-", "cuda"))
host = got.get(("migrate (dynmo.torch)", "gloo", "cpu"))
if d2h and h2d and host:
    staged = 1 / (1 / d2h + 1 / host + 1 / h2d)
    print(f"  composed, not measured: a CUDA layer staged through the host over Gloo "
          f"(D2H + the Gloo host migration + H2D, serial) ~ {staged:.2f} GB/s")
if not any(k[1] == "nccl" for k in got):
    print("  not measured: NCCL device to device between two ranks (needs 2 GPUs: NCCL "
          "refuses two ranks on one); the C++ bench has CPU tensors only")
if smoke:
    print("\nCPU SMOKE: toy sizes, 2 shared cores: these figures check the script, not DynMo")
EOF
say "report: $report; records and logs: $runs; $failures run(s) failed"
((failures == 0))
