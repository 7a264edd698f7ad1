#!/usr/bin/env bash
# Trainer benchmark (a scripted run, not a test): what DynMo's re-balancing
# buys a real dynmo-train job, whether the simulator predicted it, what the
# per-layer clocks cost, and how fast a layer's state migrates.
#
#   bash bench/trainer_bench.sh [BUILD_BIN_DIR]     (default build/bin)
#   needs: dynmo-train, dynmo-sim, dynmo-bench-migration; python3
#
# 1. Re-balancing: pp=2, one intra-op thread per rank, from a skewed
#    partition (--layers=8 --initial_boundaries=0,9,10: 9 of 10 pipeline
#    layers on stage 0), embedded coordinator, --balancer=time
#    --trigger=every:N. Tokens/s before the first plan and after the last
#    one, each next to the core pipeline simulator's prediction (dynmo-sim
#    1F1B, fed the per-layer forward/backward times the JSON log measured in
#    the same window, per micro-batch, no transfer time).
# 2. Profiling overhead: the same model on a balanced pp=2 partition with
#    --profile_layers=true and =false, runs alternated, median iteration
#    time of each; overhead = (true - false) / false.
# 3. Migration throughput: dynmo-bench-migration (a decoder block with its
#    AdamW state, SendLayerState -> RecvLayerState, against a plain Gloo send
#    of the same bytes) at two layer sizes.
# Knobs (environment): STEPS (default 40), EVERY (10), HIDDEN (128),
# SEQ (64), MB (4), M (8), PAIRS (3), OVERHEAD_STEPS (15).
set -euo pipefail
bin="${1:-build/bin}"
steps="${STEPS:-40}"
every="${EVERY:-10}"
hidden="${HIDDEN:-128}"
seq="${SEQ:-64}"
mb="${MB:-4}"
m="${M:-8}"
pairs="${PAIRS:-3}"
overhead_steps="${OVERHEAD_STEPS:-15}"
work="$(mktemp -d /tmp/dynmo-trainer-bench.XXXXXX)"
trap 'rm -rf "$work"' EXIT

model=(--layers=8 --hidden="$hidden" --heads=4 --seq_len="$seq" --micro_batch="$mb"
       --microbatches="$m" --intra_op_threads=1 --timeout_s=120)

. "$(dirname "$0")/local_ranks.sh"

run_pp2() {  # log_json extra-flags...
  local log=$1
  shift
  run_ranks "$bin" 2 "$work" --pp=2 "${model[@]}" --log_json="$log" "$@"
}

echo "== 1. re-balancing a skewed pp=2 job (steps $steps, every:$every) =="
run_pp2 "$work/rebalance.jsonl" --steps="$steps" --initial_boundaries=0,9,10 \
  --coordinator=embedded --job=bench --balancer=time --trigger="every:$every"
grep "applied plan" "$work/rank0.out" || echo "(no plan applied)"

python3 - "$work/rebalance.jsonl" "$bin/dynmo-sim" "$m" "$((mb * m * seq))" <<'PY'
import json, subprocess, sys
log, sim, m, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
recs = [json.loads(l) for l in open(log) if l.strip()]
epochs = [r["epoch"] for r in recs]
def window(rs):
    # Skip the first two iterations of a window (warm-up, migration).
    return rs[2:] if len(rs) > 4 else rs
before = window([r for r in recs if r["epoch"] == epochs[0]])
after = window([r for r in recs if r["epoch"] == epochs[-1]])
def summary(name, rs):
    b = rs[-1]["boundaries"]
    n = len(rs)
    fwd = [sum(r["layer_forward_s"][l] for r in rs) / n / m for l in range(len(rs[0]["layer_forward_s"]))]
    bwd = [sum(r["layer_backward_s"][l] for r in rs) / n / m for l in range(len(fwd))]
    stages = ",".join("%.9g:%.9g:0" % (sum(fwd[b[s]:b[s+1]]), sum(bwd[b[s]:b[s+1]]))
                      for s in range(len(b) - 1))
    out = subprocess.run([sim, "--schedule", "1f1b", "--microbatches", str(m),
                          "--stage-times", stages], capture_output=True, text=True, check=True)
    t_pred = json.loads(out.stdout)["iteration_time"]
    t_meas = sorted(r["iteration_s"] for r in rs)[n // 2]
    tps_meas = tokens / t_meas
    tps_pred = tokens / t_pred
    print("%-7s boundaries %-10s iterations %2d  measured %7.0f tok/s (median iteration %.4f s)"
          "  simulator %7.0f tok/s (%.4f s)  measured/predicted %.3f" %
          (name, ",".join(map(str, b)), n, tps_meas, t_meas, tps_pred, t_pred, tps_meas / tps_pred))
    return tps_meas, tps_pred
if epochs[0] == epochs[-1]:
    print("no re-balance happened; cannot compare before/after")
    sys.exit(0)
mb0, pb0 = summary("before", before)
mb1, pb1 = summary("after", after)
print("speed-up measured %.2fx, predicted %.2fx" % (mb1 / mb0, pb1 / pb0))
PY

echo "== 2. profiling overhead (balanced pp=2, $pairs pairs of $overhead_steps steps) =="
for i in $(seq 1 "$pairs"); do
  for p in true false; do
    run_pp2 "$work/prof_${p}_$i.jsonl" --steps="$overhead_steps" --profile_layers=$p
  done
done
python3 - "$work" "$pairs" <<'PY'
import json, sys, statistics
work, pairs = sys.argv[1], int(sys.argv[2])
def iters(p):
    out = []
    for i in range(1, pairs + 1):
        rs = [json.loads(l) for l in open("%s/prof_%s_%d.jsonl" % (work, p, i)) if l.strip()]
        out += [r["iteration_s"] for r in rs[2:]]
    return out
on, off = iters("true"), iters("false")
mon, moff = statistics.median(on), statistics.median(off)
print("median iteration: per-layer clocks %.4f s, stage clocks only %.4f s, overhead %+.2f%% "
      "(%d iterations each)" % (mon, moff, 100 * (mon - moff) / moff, len(on)))
PY

echo "== 3. migration throughput (dynmo-bench-migration) =="
for h in 512 1024; do
  "$bin/dynmo-bench-migration" --hidden "$h" --reps 7
done
