#!/usr/bin/env bash
# Checks deploy/prometheus with promtool: both scrape configs, the alert
# rules, and the rules' unit tests.
#   prometheus_test.sh SOURCE_DIR
set -euo pipefail
src="$(cd "${1:?usage: prometheus_test.sh SOURCE_DIR}" && pwd)"
dir="$src/deploy/prometheus"
if ! command -v promtool >/dev/null; then
  echo "FAIL: promtool is not installed (Debian package 'prometheus'; scripts/install-deps.sh installs it)" >&2
  exit 1
fi
promtool --version 2>&1 | head -n 1

promtool check config "$dir/prometheus.yml"
promtool check rules "$dir/dynmo-alerts.yml"
promtool test rules "$dir/dynmo-alerts.test.yml"

# Debian builds Prometheus without Kubernetes service discovery, so its
# promtool rejects kubernetes_sd_configs. Check that config as is where
# promtool knows the field, else with the discovery swapped for a static
# target: everything else (relabelling, honor_labels, rule files) still gets
# checked.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if out="$(promtool check config "$dir/prometheus-kubernetes.yml" 2>&1)"; then
  echo "$out"
elif grep -q "field kubernetes_sd_configs not found" <<<"$out"; then
  echo "promtool lacks Kubernetes discovery; checking prometheus-kubernetes.yml with a static target"
  cp "$dir/dynmo-alerts.yml" "$work/"
  python3 - "$dir/prometheus-kubernetes.yml" "$work/prometheus-kubernetes.yml" <<'PY'
import sys, yaml
cfg = yaml.safe_load(open(sys.argv[1]))
for sc in cfg["scrape_configs"]:
    assert sc.get("honor_labels") is True, f"{sc['job_name']}: honor_labels must be true"
    if sc.pop("kubernetes_sd_configs", None) is not None:
        sc["static_configs"] = [{"targets": ["dynmo-coordinator.dynmo.svc:9464"]}]
yaml.safe_dump(cfg, open(sys.argv[2], "w"))
PY
  promtool check config "$work/prometheus-kubernetes.yml"
else
  echo "$out" >&2
  exit 1
fi
echo "prometheus_test: OK"
