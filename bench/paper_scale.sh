#!/bin/bash
# The six cases at the paper's scale in the simulator, pipeline units of
# whole blocks and of halves: prints the table of docs/benchmarks.md
# ("Paper scale: what freed GPUs buy") and writes the plot.
#   bash bench/paper_scale.sh BIN_DIR [OUT_DIR]   (after `ninja dynmo-bench-paper-scale`)
set -euo pipefail
bin=${1:?usage: paper_scale.sh BIN_DIR [OUT_DIR]}
out=${2:-docs/img}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin/dynmo-bench-paper-scale" --units blocks > "$tmp/blocks.json"
"$bin/dynmo-bench-paper-scale" --units halves > "$tmp/halves.json"
cp "$tmp/blocks.json" "$tmp/halves.json" "$out/" 2>/dev/null || true
mv "$out/blocks.json" "$out/paper_scale_blocks.json"
mv "$out/halves.json" "$out/paper_scale_halves.json"
python3 "$here/paper_scale_report.py" "$out/paper_scale.svg" \
  "$out/paper_scale_blocks.json" "$out/paper_scale_halves.json"
