#!/usr/bin/env bash
# Coordinator load benchmark: dynmo-coordinator plus dynmo-loadgen with 1,024
# and 4,096 simulated agents (8-stage pipelines, 128 / 512 data-parallel
# replicas) reporting every iteration, on one machine, each rank on its own
# Session stream (--ranks_per_session 1) or 8 ranks per multiplexed
# HostSession stream (--ranks_per_session 8, one per node). Prints, per run:
# sustained reports/s, p50 / p99 / max time from plan decision to the last
# agent holding its COMMIT, coordinator CPU seconds and share of one core,
# coordinator peak RSS, loadgen peak RSS, and the coordinator's own count of
# plans issued and aborted (a plan aborted before any rank held it committed,
# e.g. because its lead was too short, never reaches the loadgen's count).
#
#   bash bench/coordinator_load.sh [BUILD_BIN_DIR] [ROWS]  (default build/bin, all)
#
# ROWS = "all" (default), "4096" (only the 4,096-agent rows, single and
# multiplexed, both commit modes), "mux" (only the multiplexed rows) or
# "relay" (only 4,096 ranks through 512 node relays of 8, both commit modes).
#
# The workload is a scripted trace whose heavy quarter of the layers moves
# from the front to the back of the model every 20 iterations, so every:10
# keeps issuing plans that really move layers.
set -euo pipefail
bin="${1:-build/bin}"
rows="${2:-all}"
work="$(mktemp -d /tmp/dynmo-bench.XXXXXX)"
trap 'kill "${coord:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT

python3 - "$work/skew.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for k in range(400):
        phase = (k // 20) % 2
        layers = []
        for l in range(32):
            heavy = l < 8 if phase == 0 else l >= 24
            t = 0.004 if heavy else 0.001
            layers.append({"fwd": t, "bwd": t, "wgrad": t, "mem_bytes": 1 << 24})
        f.write(json.dumps({"iter": k, "layers": layers}) + "\n")
PY

run() {  # agents dp iteration_ms iterations commit [ranks_per_session] [relay_ranks_per_node]
  local agents=$1 dp=$2 ms=$3 iters=$4 commit=$5 k=${6:-1} relay=${7:-0} port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$bin/dynmo-coordinator" --listen "127.0.0.1:$port" --trigger every:10 \
      --plan_lead_iterations 5 --commit "$commit" --max_ranks_per_job 65536 \
      --max_replica_layers 1048576 > "$work/coord.log" 2>&1 &
  coord=$!
  sleep 0.5
  /usr/bin/time -f "%M" -o "$work/lg.rss" "$bin/dynmo-loadgen" \
      --coordinator "127.0.0.1:$port" --job "bench$agents" --agents "$agents" \
      --dp "$dp" --iterations "$iters" --iteration_ms "$ms" \
      --trace "$work/skew.jsonl" --drain_s 1 --ranks_per_session "$k" \
      --relay_ranks_per_node "$relay" > "$work/lg.json"
  "$bin/dynmo-ctl" --coordinator "127.0.0.1:$port" --json job "bench$agents" \
      > "$work/job.json" 2>/dev/null || echo '{}' > "$work/job.json"
  local ticks hwm
  ticks=$(awk '{print $14 + $15}' "/proc/$coord/stat")
  hwm=$(awk '/VmHWM/ {print $2}' "/proc/$coord/status")
  kill "$coord"; wait "$coord" 2>/dev/null || true
  python3 - "$work/lg.json" "$ticks" "$hwm" "$(cat "$work/lg.rss")" "$(getconf CLK_TCK)" "$commit" "$work/job.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
history = json.load(open(sys.argv[7])).get("history", [])
aborted = sum(1 for h in history if h.get("outcome") == "PLAN_OUTCOME_ABORTED")
ticks, hwm, lg_rss, hz = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
cpu = ticks / hz
wall = d["run_seconds"] + 1.5
per = f"{d['relay_ranks_per_node']} (relay)" if d.get('relay_ranks_per_node') else d['ranks_per_session']
print(f"| {d['agents']} | {d['stages']}x{d['replicas']} | {per} | {sys.argv[6]} | {d['reports_per_second']:.0f} | "
      f"{d['samples_dropped']} | {d['plans_applied']}/{len(history)} ({aborted} aborted) | "
      f"{d['plan_delivery_ms_p50']:.0f} | {d['plan_delivery_ms_p99']:.0f} | {d['plan_delivery_ms_max']:.0f} | "
      f"{cpu:.1f} s ({100 * cpu / wall:.0f}% of a core) | {hwm / 1024:.0f} MiB | {lg_rss / 1024:.0f} MiB |")
PY
}

echo "| agents | stages x replicas | ranks/session | commit | reports/s | dropped | plans applied/issued | delivery p50 ms | p99 ms | max ms | coordinator CPU | coordinator peak RSS | loadgen peak RSS |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
if [[ $rows == all ]]; then
  run 1024 128 50 200 two-phase   # 1,024 agents x 20 it/s = 20,480 reports/s offered
  run 1024 128 20 200 two-phase   # 1,024 agents x 50 it/s = 51,200 reports/s offered
fi
if [[ $rows == all || $rows == 4096 ]]; then
  run 4096 512 200 100 two-phase  # 4,096 agents x 5 it/s  = 20,480 reports/s offered
  run 4096 512 100 100 two-phase  # 4,096 agents x 10 it/s = 40,960 reports/s offered
fi
if [[ $rows == all ]]; then run 1024 128 50 200 in-band; fi
if [[ $rows == all || $rows == 4096 ]]; then
  run 4096 512 200 100 in-band
  run 4096 512 100 100 in-band
fi
if [[ $rows == relay ]]; then
  # 4,096 ranks, each its own Agent, through 512 node relays of 8 ranks
  # (what dynmo-launch runs per node): 512 upstream streams; beside them the
  # same ranks as 512 in-process HostAgents, and as 4,096 direct sessions.
  run 4096 512 200 100 two-phase 8
  run 4096 512 200 100 two-phase 1
  run 4096 512 200 100 two-phase 1 8
  run 4096 512 200 100 in-band 1 8
  exit 0
fi
# The same 4,096 ranks, 8 per multiplexed HostSession (512 streams).
run 4096 512 200 100 two-phase 8
run 4096 512 100 100 two-phase 8
run 4096 512 200 100 in-band 8
run 4096 512 100 100 in-band 8
