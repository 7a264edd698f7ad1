#!/bin/bash
# The what-if tool at paper scale, through the coordinator's own code: the
# six section 2.2 cases (48 blocks, 200 iterations, seed 1) on 24 stages x
# {1, 30} replicas, in whole blocks and in halves, with the coordinator's
# defaults (auto trigger, no elastic mode) and with --elastic release and
# reshape, migrations at 25 GB/s, a device holding 1.5 x the static
# layout's fullest stage at iteration 0 (2 dense blocks of 805 MB: 2.4 GB;
# MoE blocks are larger, so its cap is 1.5 x its own), and the ceilings of
# coordinator/job/replay_bounds.h: the re-partition oracle, the same delayed
# by the plan lead, the fewest GPU-hours any release keeping 98% of static's
# tokens/s can spend, and every iteration on its fastest grid. Prints a
# markdown table (docs/benchmarks.md, "What-if through the coordinator's
# code"); deterministic, so one run is the figure.
#   bash bench/whatif_sweep.sh BIN_DIR
set -euo pipefail
bin=${1:?usage: whatif_sweep.sh BIN_DIR}
sim="$bin/dynmo-sim"
echo "| case | units | grid | default (auto) | oracle delayed by the plan lead | oracle | plans | release: tok/s, GPU-hours (bound) | reshape: tok/s, last tenth (bound), final grid |"
echo "|---|---|---|---|---|---|---|---|---|"
for units in blocks halves; do
  for dp in 1 30; do
    for sc in pruning freezing sparse-attention early-exit moe mod; do
      cap=2415919104
      [ "$sc" = moe ] && cap=4026531840  # 1.5 x two 1.34 GB MoE blocks
      common=(--scenario "$sc" --stages 24 --dp "$dp" --layers 48 --units "$units" --bandwidth 25e9
              --capacity "$cap")
      d=$("$sim" "${common[@]}" --oracle)
      r=$("$sim" "${common[@]}" --elastic release --oracle)
      s=$("$sim" "${common[@]}" --elastic reshape --oracle)
      python3 - "$sc" "$units" "$dp" "$d" "$r" "$s" <<'PY'
import json, sys
sc, units, dp = sys.argv[1:4]
d, r, s = (json.loads(x) for x in sys.argv[4:7])
gh = r["gpu_hours"]
rb = r["oracle"]["release"]["fraction_of_static"]
sb = s["oracle"]["reshape"]
print(f"| {sc} | {units} | 24×{dp} | {d['speedup']:.3f}× | {d['oracle']['delayed']['speedup']:.3f}× | "
      f"{d['oracle']['speedup']:.3f}× | {d['decisions']} | "
      f"{r['speedup']:.3f}×, {100 * gh['dynamic'] / gh['static']:.0f}% ({100 * rb:.0f}%) | "
      f"{s['speedup']:.3f}×, {s['last_tenth_speedup']:.3f}× ({sb['speedup']:.3f}×, "
      f"{sb['last_tenth_speedup']:.3f}×), {s['final_grid']} |")
PY
    done
  done
done
