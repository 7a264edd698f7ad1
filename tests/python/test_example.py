"""examples/torch/gpt_pipeline.py under torchrun (2 ranks, Gloo): DynMo
re-balances the skewed start live and the losses are bit-identical to the
static run of the same seed and micro-batches.
Two ranks are pinned to --device=cpu: the losses are compared bit for bit,
and NCCL refuses two ranks on the one GPU of a GPU check ("Duplicate GPU
detected")."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

STEPS = 25


def run_example(source_dir, bin_dir, tmp_path, name, *args):
    log = tmp_path / f"{name}.jsonl"
    env = dict(os.environ, DYNMO_BIN_DIR=bin_dir, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node=2",
           os.path.join(source_dir, "examples", "torch", "gpt_pipeline.py"),
           f"--steps={STEPS}", "--boundaries=0,7,10", "--device=cpu", f"--log_json={log}",
           *args]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=100)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with open(log) as f:
        return [json.loads(line) for line in f], r.stdout


def test_dynmo_rebalances_with_bit_identical_losses(source_dir, bin_dir, tmp_path):
    static, _ = run_example(source_dir, bin_dir, tmp_path, "static", "--coordinator=none")
    dynamic, out = run_example(source_dir, bin_dir, tmp_path, "dynamic",
                               "--coordinator=embedded", "--trigger=every:5")
    assert [r["iter"] for r in dynamic] == list(range(STEPS))
    # Bit-identical: JSON floats round-trip exactly.
    assert [r["loss"] for r in dynamic] == [r["loss"] for r in static]
    assert all(r["boundaries"] == [0, 7, 10] and r["epoch"] == 0 for r in static)
    applied = [r for r in dynamic if r["epoch"] > 0]
    assert applied, "no plan was applied:\n" + out[-3000:]
    assert applied[0]["boundaries"] != [0, 7, 10] and applied[0]["moved_bytes"] > 0
    assert "applied plan epoch" in out
    assert static[-1]["loss"] < static[0]["loss"]


def test_bad_boundaries_are_one_line_errors(source_dir, bin_dir, tmp_path):
    env = dict(os.environ, DYNMO_BIN_DIR=bin_dir)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node=2",
           os.path.join(source_dir, "examples", "torch", "gpt_pipeline.py"),
           "--steps=1", "--boundaries=0,10", "--coordinator=none", "--device=cpu"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=100)
    assert r.returncode != 0
    assert "--boundaries 0,10 must be" in r.stdout + r.stderr
