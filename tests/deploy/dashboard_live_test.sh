#!/usr/bin/env bash
# The dashboard against a real Prometheus: start dynmo-coordinator on
# loopback (free ports, a temporary state dir), drive it with dynmo-loadgen
# (8 agents, a scenario that makes it rebalance and re-pack), provoke one
# failed RPC with dynmo-ctl, let Prometheus (Debian's `prometheus`, scraping
# every second with deploy/prometheus's scrape settings and alert rules)
# collect, then run every panel query of dashboards/dynmo.json through the
# HTTP API and assert each returns data (dashboard_live_query.py).
#
#   DYNMO_BIN_DIR=build/bin dashboard_live_test.sh SOURCE_DIR
#
# Every process it starts is stopped on exit, whatever happens.
set -euo pipefail
src="$(cd "${1:?usage: dashboard_live_test.sh SOURCE_DIR}" && pwd)"
bin="${DYNMO_BIN_DIR:?set DYNMO_BIN_DIR to the folder holding dynmo-coordinator}"
job="live-moe"

for tool in prometheus promtool python3; do
  if ! command -v "$tool" >/dev/null; then
    echo "FAIL: '$tool' is not installed; the live dashboard test needs Debian's" \
         "prometheus package (scripts/install-deps.sh installs it)." >&2
    exit 1
  fi
done
python3 -c 'import yaml' 2>/dev/null || { echo "FAIL: python3-yaml is not installed" >&2; exit 1; }
for b in dynmo-coordinator dynmo-loadgen dynmo-ctl; do
  [ -x "$bin/$b" ] || { echo "FAIL: $bin/$b not built" >&2; exit 1; }
done

work="$(mktemp -d)"
pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "$rc" -ne 0 ]; then
    for log in "$work"/*.log; do
      [ -f "$log" ] && { echo "--- $(basename "$log") (tail)"; tail -n 20 "$log"; }
    done
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local deadline=$((SECONDS + $1)) what="$2"; shift 2
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then echo "FAIL: timed out waiting for $what" >&2; return 1; fi
    sleep 0.2
  done
}
http_ok() { python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$1"; }

# 1. The coordinator, on loopback ports the kernel picks.
grpc_port="$(free_port)"
metrics_port="$(free_port)"
"$bin/dynmo-coordinator" --listen="127.0.0.1:$grpc_port" \
  --metrics_listen="127.0.0.1:$metrics_port" --state_dir="$work/state" \
  --trigger=every:20 --repack --repack_tolerance=0.5 >"$work/coordinator.log" 2>&1 &
pids+=($!)
wait_for 20 "coordinator /metrics" http_ok "http://127.0.0.1:$metrics_port/metrics"
echo "coordinator: gRPC 127.0.0.1:$grpc_port, metrics 127.0.0.1:$metrics_port"

# 2. Prometheus with the shipped deploy/prometheus/prometheus.yml (its scrape
#    job, honor_labels and alert rules), retargeted at this coordinator and
#    sped up to scrape and evaluate every second.
prom_port="$(free_port)"
cp "$src/deploy/prometheus/dynmo-alerts.yml" "$work/"
python3 - "$src/deploy/prometheus/prometheus.yml" "$work/prometheus.yml" "127.0.0.1:$metrics_port" <<'PY'
import sys, yaml
cfg = yaml.safe_load(open(sys.argv[1]))
cfg["global"].update(scrape_interval="1s", evaluation_interval="1s")
cfg.pop("alerting", None)
(job,) = [sc for sc in cfg["scrape_configs"] if sc["job_name"] == "dynmo-coordinator"]
job["scrape_interval"] = "1s"
job["static_configs"] = [{"targets": [sys.argv[3]]}]
yaml.safe_dump(cfg, open(sys.argv[2], "w"))
PY
promtool check config "$work/prometheus.yml" >/dev/null
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" --log.level=warn >"$work/prometheus.log" 2>&1 &
pids+=($!)
prom="http://127.0.0.1:$prom_port"
wait_for 30 "prometheus ready" http_ok "$prom/-/ready"
# Prometheus scrapes a new target only after a few seconds; activity before
# its first scrape would never show in a rate.
scraped() {
  python3 - "$prom" <<'PY'
import json, sys, urllib.parse, urllib.request
q = urllib.parse.urlencode({"query": 'up{job="dynmo-coordinator"} == 1'})
with urllib.request.urlopen(f"{sys.argv[1]}/api/v1/query?{q}", timeout=2) as r:
    sys.exit(0 if json.load(r)["data"]["result"] else 1)
PY
}
wait_for 30 "the first scrape of the coordinator" scraped
echo "prometheus: $prom, scraping the coordinator"

# 3. Load: 8 agents replaying a scenario whose drift makes the coordinator
#    issue plans and, with the loose re-packing tolerance, release GPUs.
#    Around it, two RPCs that must fail (unknown job): the first creates the
#    error series, the second makes its rate positive.
fail_rpc() {
  if "$bin/dynmo-ctl" --coordinator="127.0.0.1:$grpc_port" job no-such-job >>"$work/ctl.log" 2>&1; then
    echo "FAIL: dynmo-ctl job no-such-job succeeded" >&2; exit 1
  fi
}
fail_rpc
"$bin/dynmo-loadgen" --coordinator="127.0.0.1:$grpc_port" --job="$job" --agents=8 \
  --iterations=400 --iteration_ms=20 --scenario=pruning >"$work/loadgen.log" 2>&1 &
pids+=($!)
wait "${pids[-1]}"  # in the background so that a signal stops the test at once
echo "loadgen: $(tail -c 600 "$work/loadgen.log" | tr -s ' \n' ' ')"
fail_rpc

# The coordinator's exposition must be valid for Prometheus.
python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())' \
  "http://127.0.0.1:$metrics_port/metrics" >"$work/metrics.txt"
promtool check metrics <"$work/metrics.txt"
echo "promtool check metrics: OK ($(grep -c '^dynmo_' "$work/metrics.txt") dynmo_ samples)"

# 4. Let a few scrapes and rule evaluations land after the last change.
sleep 4
# Panels that must show activity, not just zeros: plans, bytes migrated,
# GPUs, reports, RPC errors, decision latency.
python3 "$src/tests/deploy/dashboard_live_query.py" "$prom" "$src/dashboards/dynmo.json" "$job" \
  --positive=5,6,7,8,9,10 --released
echo "dashboard_live_test: OK"
