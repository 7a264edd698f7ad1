#!/usr/bin/env bash
# torchtitan's own Qwen3 MoE under DynMo (issue 40 item 4), on this machine:
# examples/torch/moe_pipelining.py (torchtitan 0.2.2's Qwen3Model with
# moe_enabled, 8 MoE blocks of 16 experts, top 2; 2 pipeline ranks under
# torchrun, each pinned to its own core, Gloo, 1F1B) with a skewed router:
# blocks HOT (default 4,5,6,7) send every token to 2 experts, the others
# route as their gates say. In this one invocation:
#   trials     every static split 0,k,10 (k = 1..9) for TRIAL_STEPS
#              (default 6) iterations; the best static split is the one
#              whose slowest stage is fastest, each stage's layers' measured
#              seconds taken at their least disturbed iteration after the
#              first two (on a shared machine whole iteration times pick
#              whichever trial the neighbours left alone);
#   then ROUNDS (default 2) rounds, each of three runs of STEPS (default
#   30) iterations, one after the other so each round's three see about
#   the same machine:
#     static   from a skewed split START (default 0,9,10: the embedding and
#              all 8 blocks on rank 0, the head alone on rank 1);
#     dynmo    the same start with the embedded coordinator (trigger auto);
#     best     the best static split.
# Prints per round tokens/s of each (the whole run's, and the median from
# DynMo's first plan on), the ratios DynMo / static and DynMo / best (per
# round and their median), whether every run's losses are identical, the
# plans, and each block's busiest-expert share and measured seconds;
# records: out/moe-*.jsonl.
#
#   bash bench/moe_pipelining.sh [BUILD_DIR] [extra example flags...]
#
# Needs BUILD_DIR (default build) to hold the dynmo Python package and
# dynmo-coordinator, and the torch venv of scripts/install-torch.sh
# (torchtitan 0.2.2). PYTHON_DIR overrides where the dynmo package is read.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/local_ranks.sh
build="${1:-build}"
shift || true
example_env "$build"
export EXAMPLE=moe_pipelining.py
steps="${STEPS:-30}"
trial_steps="${TRIAL_STEPS:-6}"
rounds="${ROUNDS:-2}"
start="${START:-0,9,10}"
mkdir -p out
job=(--layers 8 --experts 16 --top_k 2 --dim 64 --hidden 128 --seq_len 32
     --microbatches 8 --micro_batch 4 --hot_blocks "${HOT:-4,5,6,7}")

run() {  # NAME STEPS BOUNDARIES [example flags...]
  local name=$1 n=$2 split=$3
  shift 3
  echo "== $name ($split, $n iterations)" >&2
  pinned_example "$venv" "out/moe-$name.log" "${job[@]}" --steps "$n" \
    --initial_boundaries "$split" --log_json "out/moe-$name.jsonl" "$@"
}

trials=()
for k in 1 2 3 4 5 6 7 8 9; do
  run "trial-$k" "$trial_steps" "0,$k,10" --coordinator none "$@"
  trials+=("out/moe-trial-$k.jsonl")
done
best=$(python3 - "${trials[@]}" <<'PY'
import json, sys
def slowest_stage_s(path):
    rows = [json.loads(l) for l in list(open(path))[2:]]
    return max(min(r["stage_times"][s] for r in rows) for s in range(len(rows[0]["stage_times"])))
times = {p: slowest_stage_s(p) for p in sys.argv[1:]}
for p, t in times.items():
    print(f"  trial {json.loads(open(p).readline())['boundaries']}: slowest stage "
          f"{t:.4f} s", file=sys.stderr)
print(",".join(map(str, json.loads(open(min(times, key=times.get)).readline())["boundaries"])))
PY
)
echo "best static split by trial: $best" >&2
runs=()
for r in $(seq 1 "$rounds"); do
  run "static-$r" "$steps" "$start" --coordinator none "$@"
  run "dynmo-$r" "$steps" "$start" --coordinator embedded --trigger auto "$@"
  run "best-$r" "$steps" "$best" --coordinator none "$@"
  runs+=("out/moe-static-$r.jsonl" "out/moe-dynmo-$r.jsonl" "out/moe-best-$r.jsonl")
done
echo
python3 - "$start" "$best" "${runs[@]}" <<'PY'
import json, statistics, sys
start, best_split = sys.argv[1:3]
rounds = [[[json.loads(l) for l in open(p)] for p in sys.argv[i:i + 3]]
          for i in range(3, len(sys.argv), 3)]
def whole(run):  # tokens/s over the whole run, its first iteration left out
    return sum(r["tokens_per_s"] * r["iteration_s"] for r in run[1:]) / \
        sum(r["iteration_s"] for r in run[1:])
def steady(run, after):  # median tokens/s from `after` on
    return statistics.median(r["tokens_per_s"] for r in run[after:])
ratios = {"whole": [], "from plan": []}
losses = [[r["loss"] for r in run] for rnd in rounds for run in rnd]
for i, (static, dynmo, best) in enumerate(rounds, 1):
    plans = [(r["iteration"], r["boundaries"]) for r in dynmo if r["plan"]]
    settled = plans[0][0] if plans else len(dynmo)
    print(f"round {i}: plans {plans}")
    print(f"  {'run':<24} {'tokens/s whole run':>19} {'median from plan':>17}")
    for name, run in ((f"static ({start})", static), ("DynMo", dynmo),
                      (f"best static ({best_split})", best)):
        print(f"  {name:<24} {whole(run):>19.0f} {steady(run, settled):>17.0f}")
    for label, f in (("whole", whole), ("from plan", lambda r: steady(r, settled))):
        ratios[label].append((f(dynmo) / f(static), f(dynmo) / f(best)))
        print(f"  DynMo / static ({label}): {ratios[label][-1][0]:.3f}   "
              f"DynMo / best static: {ratios[label][-1][1]:.3f}")
for label, pairs in ratios.items():
    print(f"median over rounds ({label}): DynMo / static "
          f"{statistics.median(p[0] for p in pairs):.3f}, DynMo / best static "
          f"{statistics.median(p[1] for p in pairs):.3f}")
print("losses identical in every run, every iteration:", all(l == losses[0] for l in losses))
statics = [r for rnd in rounds for r in rnd[0][2:]]
print("per block: busiest expert's share; ms per micro-batch, fwd+bwd, median over the "
      "static runs' iterations from the third")
for b, share in enumerate(statics[-1]["hot_share"]):
    ms = statistics.median(1e3 * (r["layer_forward_s"][b + 1] + r["layer_backward_s"][b + 1])
                           / r["microbatches"] for r in statics)
    print(f"  block {b}: {share:.3f}  {ms:.1f}")
PY
