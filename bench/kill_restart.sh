#!/usr/bin/env bash
# The long form of the adapter's kill -9 test (issue 41): a 2-rank
# dynmo.pipelining job (CPU, Gloo; a plan every 3 iterations, a checkpoint
# every 4, STEPS iterations) killed KILLS times (default 12) with SIGKILL at seeded random
# points — mid-migration, inside a save, in a layer's forward, at an
# iteration boundary, and (--timed) at random wall times — each time
# restarted from its newest complete checkpoint, sometimes at another split
# (tests/python/kill_restart.py). Prints the summary line (violations: []
# when every loss and the final weights equal the uninterrupted run's and
# no half-written checkpoint was loaded) and a table of the launches;
# writes the whole summary to $OUT/kill_restart.json.
#
#   bash bench/kill_restart.sh [BUILD_DIR]      (KILLS=12, SEED=1, STEPS=48)
#
# Needs BUILD_DIR (default build) to hold the dynmo Python package and the
# torch venv of scripts/install-torch.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
venv="$(bash scripts/install-torch.sh | tail -n 1)"
export PYTHONPATH="$PWD/$build/python" DYNMO_BIN_DIR="$PWD/$build/bin" OMP_NUM_THREADS=1
out="${OUT:-out/kill-restart}"
mkdir -p "$out"
status=0
"$venv/bin/python" tests/python/kill_restart.py --kills "${KILLS:-12}" --seed "${SEED:-1}" --steps "${STEPS:-48}" \
  --timed --json "$out/kill_restart.json" || status=$?
"$venv/bin/python" - "$out/kill_restart.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{'launch':>6} {'kill':<34} {'from':<8} {'at split':<10} {'iters':<7} "
      f"{'rc':<8} {'survivor ended':<16} {'wall s':>6}")
for n, l in enumerate(s.get("launches", []), 1):
    k = l["kill"]
    kill = "-" if k is None else (f"timed {k['after_s']} s rank {k['rank']}" if k["where"] == "timed"
                                  else f"{k['where']} it {k['iteration']} rank {k['rank']}")
    it = l["iterations"]
    iters = f"{it[0]}-{it[-1]}" if it else "-"
    ended = ("harness" if l["stuck"] else
             f"itself {l['survivor_s']} s" if l["survivor_s"] is not None else "-")
    split = ",".join(map(str, l["boundaries"])) if l["boundaries"] else "saved"
    print(f"{n:>6} {kill:<34} {l['resumed_from'] or '-':<8} {split:<10} {iters:<7} "
          f"{str(l['returncodes']):<8} {ended:<16} {l['wall_s']:>6}")
PY
exit "$status"
