#!/usr/bin/env bash
# Re-shaping benchmark (a scripted run, not a test): what regrouping four
# CPU ranks from pp=4 x dp=1 into pp=2 x dp=2 buys a real dynmo-train job,
# next to what the shape predicts.
#
#   bash bench/reshape_bench.sh [BUILD_BIN_DIR]     (default build/bin)
#   needs: dynmo-train, dynmo-sim; python3
#
# Three jobs on 4 ranks, the same model and global batch (one intra-op
# thread per rank), each run RUNS times, alternated:
#   static    pp=4 x dp=1, M micro-batches per iteration;
#   grid      pp=2 x dp=2 from the start, M/2 micro-batches per replica;
#   live      pp=4 x dp=1, re-shaped to pp=2 x dp=2 before iteration
#             STEPS/2 (--test_reshape_at), tokens/s after the re-shape.
# Tokens/s of a run: global tokens / median iteration time over its window
# (the first 2 iterations of a window skipped: warm-up, the re-shape).
# Prediction: the static runs' per-layer forward + backward times per
# micro-batch (--layer_clock=cpu: each layer's own CPU time, so ranks that
# share cores still measure their work) summed per stage and replayed by
# dynmo-sim (the core pipeline simulator, 1F1B, no transfer time) for each
# shape: predicted gain = T(pp=4, M) / T(pp=2, M/2). The data-parallel
# all-reduce is not in it. Also printed: the bound when the ranks share
# CORES cores (every rank's work / CORES), which no shape beats.
# Knobs (environment): STEPS (default 30), RUNS (3), LAYERS (6), HIDDEN
# (128), SEQ (64), MB (4), M (8), CORES (nproc).
set -euo pipefail
bin="${1:-build/bin}"
steps="${STEPS:-30}"
runs="${RUNS:-3}"
layers="${LAYERS:-6}"
hidden="${HIDDEN:-128}"
seq="${SEQ:-64}"
mb="${MB:-4}"
m="${M:-8}"
cores="${CORES:-$(nproc)}"
half=$((steps / 2))
work="$(mktemp -d /tmp/dynmo-reshape-bench.XXXXXX)"
trap 'rm -rf "$work"' EXIT

model=(--layers="$layers" --hidden="$hidden" --heads=4 --seq_len="$seq" --micro_batch="$mb"
       --intra_op_threads=1 --layer_clock=cpu --timeout_s=300 --steps="$steps")

. "$(dirname "$0")/local_ranks.sh"

run4() {  # log_json extra-flags...
  local log=$1
  shift
  run_ranks "$bin" 4 "$work" "${model[@]}" --log_json="$log" "$@"
}

echo "== re-shaping pp=4 x dp=1 -> pp=2 x dp=2 on 4 CPU ranks ($runs runs of $steps steps," \
     "re-shape before iteration $half, $(nproc) cores here) =="
for i in $(seq 1 "$runs"); do
  run4 "$work/static_$i.jsonl" --pp=4 --microbatches="$m"
  run4 "$work/grid_$i.jsonl" --pp=2 --dp=2 --microbatches=$((m / 2))
  run4 "$work/live_$i.jsonl" --pp=4 --microbatches="$m" --test_reshape_at="$half:2x2"
  grep -h "re-shaped" "$work/rank0.out" || true
done

python3 - "$work" "$runs" "$bin/dynmo-sim" "$m" "$((mb * m * seq))" "$half" "$cores" <<'PY'
import json, statistics, subprocess, sys
work, runs, sim, m, tokens, half, cores = sys.argv[1], int(sys.argv[2]), sys.argv[3], \
    int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
def load(name, i):
    return [json.loads(l) for l in open("%s/%s_%d.jsonl" % (work, name, i)) if l.strip()]
def tps(rs):
    return tokens / statistics.median(r["iteration_s"] for r in rs)
per = {"static": [], "grid": [], "live": []}
static_recs = []
for i in range(1, runs + 1):
    s = load("static", i)
    static_recs += s[2:]
    per["static"].append(tps(s[2:]))
    per["grid"].append(tps(load("grid", i)[2:]))
    per["live"].append(tps([r for r in load("live", i) if r["iter"] >= half + 2]))
for k, v in per.items():
    print("%-7s tokens/s per run: %s  median %.0f" %
          (k, " ".join("%.0f" % x for x in v), statistics.median(v)))
# Per-layer work per micro-batch, from the static runs.
n_layers = len(static_recs[0]["layer_forward_s"])
layer = [statistics.median((r["layer_forward_s"][l] + r["layer_backward_s"][l]) / m
                           for r in static_recs) for l in range(n_layers)]
fwd = [statistics.median(r["layer_forward_s"][l] / m for r in static_recs) for l in range(n_layers)]
def simulate(b, micro):
    stages = ",".join("%.9g:%.9g:0" % (sum(fwd[b[s]:b[s + 1]]),
                                       sum(layer[b[s]:b[s + 1]]) - sum(fwd[b[s]:b[s + 1]]))
                      for s in range(len(b) - 1))
    out = subprocess.run([sim, "--schedule", "1f1b", "--microbatches", str(micro),
                          "--stage-times", stages], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["iteration_time"]
b4 = static_recs[0]["boundaries"]
b2 = load("grid", 1)[0]["boundaries"]
t4 = simulate(b4, m)
t2 = simulate(b2, m // 2)
work_s = sum(layer) * m  # every rank's work of one iteration, all replicas
bound4 = max(t4, work_s / cores)
bound2 = max(t2, work_s / cores)
print("per-layer fwd+bwd per micro-batch (ms): %s" % " ".join("%.2f" % (x * 1e3) for x in layer))
print("simulated 1F1B iteration: pp=4 (%s) M=%d %.4f s; pp=2 (%s) M=%d %.4f s" %
      (",".join(map(str, b4)), m, t4, ",".join(map(str, b2)), m // 2, t2))
print("predicted gain of pp=2 x dp=2 over pp=4 x dp=1: %.3fx (shape alone); "
      "%.3fx when 4 ranks share %d cores (iteration >= all work / cores = %.4f s)" %
      (t4 / t2, bound4 / bound2, cores, work_s / cores))
s, g, l = (statistics.median(per[k]) for k in ("static", "grid", "live"))
print("measured gain: pp=2 x dp=2 from the start %.3fx, live re-shape (after it) %.3fx" %
      (g / s, l / s))
print("measured / predicted (shape alone): grid %.3f, live %.3f" %
      (g / s / (t4 / t2), l / s / (t4 / t2)))
PY
