"""examples/torch/llama_pipelining.py under torchrun (2 ranks, Gloo):
DynMo re-splits the skewed torch.distributed.pipelining job live, with the
static run's losses bit for bit, and writes the --log_json records the
bench and scripts/dynmo-report read.
Two ranks are pinned to --device=cpu: the losses are compared bit for bit,
and NCCL refuses two ranks on the one GPU of a GPU check ("Duplicate GPU
detected")."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

STEPS = 16


def run_example(source_dir, bin_dir, tmp_path, name, *args, check=True):
    log = tmp_path / f"{name}.jsonl"
    env = dict(os.environ, DYNMO_BIN_DIR=bin_dir, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node=2",
           os.path.join(source_dir, "examples", "torch", "llama_pipelining.py"),
           f"--steps={STEPS}", "--layers=6", "--dim=64", "--seq_len=32",
           "--microbatches=4", "--device=cpu", f"--log_json={log}", *args]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if not check:
        return r
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with open(log) as f:
        return [json.loads(line) for line in f], r.stdout


def test_dynmo_resplits_the_pipeline_with_bit_identical_losses(source_dir, bin_dir, tmp_path):
    start = "--initial_boundaries=0,7,8"
    static, _ = run_example(source_dir, bin_dir, tmp_path, "static", "--coordinator=none",
                            start, "--dynamism=both")
    live, out = run_example(source_dir, bin_dir, tmp_path, "live", "--coordinator=embedded",
                            "--trigger=every:3", start, "--dynamism=both")
    assert [r["iteration"] for r in live] == list(range(STEPS))
    for r in live:
        assert {"iteration", "loss", "tokens_per_s", "boundaries", "stage_times",
                "iteration_s", "epoch"} <= set(r)
        assert r["tokens_per_s"] > 0
    assert [r["loss"] for r in live] == [r["loss"] for r in static]
    # Per-layer clocks in the log (embedding, 6 blocks, head): the adapter's
    # run opens as a per-layer timeline and replays in the what-if tool.
    for r in live:
        assert len(r["layer_forward_s"]) == len(r["layer_backward_s"]) == 8
        assert all(x > 0 for x in r["layer_forward_s"]), r["layer_forward_s"]
        assert all(b >= w for b, w in zip(r["layer_backward_s"], r["layer_weight_grad_s"]))
    from dynmo.perfetto import timeline
    from dynmo.whatif import trace_from_log
    names = {e["name"] for e in timeline(live)["traceEvents"] if e.get("ph") == "X"}
    assert {"L0 F", "L7 F", "L7 B"} <= names
    assert len(trace_from_log(live)) == STEPS
    assert all(r["boundaries"] == [0, 7, 8] for r in static)
    applied = [r for r in live if r["epoch"] > 0]
    assert applied, "no plan was applied:\n" + out[-3000:]
    assert applied[0]["boundaries"] != [0, 7, 8] and applied[0]["moved_bytes"] > 0
    assert "applied" in out


def test_bad_flags_are_one_line_errors(source_dir, bin_dir, tmp_path):
    r = run_example(source_dir, bin_dir, tmp_path, "bad", "--coordinator=none",
                    "--schedule=Zigzag", check=False)
    assert r.returncode != 0
    assert "llama_pipelining: dynmo.pipelining: Unknown schedule name 'Zigzag'" in r.stderr
