#!/usr/bin/env bash
# What DynMo's per-layer clocks cost on a GPU: dynmo-train on one CUDA rank
# with --profile_layers=true (CUDA events around every layer's forward and
# backward, read once per iteration) and =false (one span per stage pass),
# alternated RUNS times each so drift and warm-up fall on both alike, on a
# small launch-bound job and on a wider one that keeps the GPU busy.
# Prints one line per run and a table of medians (iterations 3..N of each
# run; the median over its runs) with the overhead in percent.
#
#   bash scripts/gpu-clock-overhead.sh BIN_DIR OUT_DIR [RUNS=3] [STEPS=20]
#
# scripts/gpu-check.sh runs it in its test call; it needs a CUDA device.
set -uo pipefail
if (($# < 2)); then
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 2
fi
bin=$1
out=$2
runs=${3:-3}
steps=${4:-20}
mkdir -p "$out" || exit 1
sizes=(
  "small:--layers=8"
  "wide:--layers=8 --hidden=1024 --heads=16 --seq_len=256 --micro_batch=8"
)
rc=0
for size in "${sizes[@]}"; do
  name=${size%%:*}
  read -r -a args <<<"${size#*:}"
  for ((r = 1; r <= runs; r++)); do
    for p in true false; do
      log=$out/$name-$p-$r.jsonl
      if ! timeout -k 5 120 "$bin/dynmo-train" "${args[@]}" --steps="$steps" --device=cuda \
        --profile_layers="$p" --log_json="$log" >"$out/$name-$p-$r.log" 2>&1; then
        echo "$name profile_layers=$p run $r: FAILED (see $out/$name-$p-$r.log)"
        tail -5 "$out/$name-$p-$r.log"
        rc=1
      fi
    done
  done
done
env -u LD_LIBRARY_PATH python3 - "$out" <<'EOF' || rc=1
import json, os, sys
out = sys.argv[1]
def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")
runs = {}
for f in sorted(os.listdir(out)):
    if not f.endswith(".jsonl"):
        continue
    name, prof, r = f[:-6].rsplit("-", 2)
    its = [json.loads(l)["iteration_s"] for l in open(os.path.join(out, f)) if '"loss"' in l]
    m = median(its[2:])
    runs.setdefault((name, prof), []).append(m)
    print(f"{name:<6} profile_layers={prof:<5} run {r}: median iteration {m * 1e3:8.2f} ms "
          f"over {len(its) - 2} iterations")
print(f"\n{'job':<6}{'runs':>5}{'with clocks ms':>16}{'without ms':>12}{'overhead':>10}")
for name in sorted({k[0] for k in runs}):
    on, off = median(runs.get((name, "true"), [])), median(runs.get((name, "false"), []))
    print(f"{name:<6}{len(runs.get((name, 'true'), [])):>5}{on * 1e3:>16.2f}{off * 1e3:>12.2f}"
          f"{100 * (on - off) / off:>+9.1f}%")
EOF
exit "$rc"
