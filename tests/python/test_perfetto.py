"""Timelines that open in Perfetto: dynmo-sim --perfetto (a simulated
iteration; a replay) and dynmo.perfetto (a run's --log_json) write valid
chrome trace-event JSON with the expected slices. The `perfetto` package's
trace processor needs a binary it downloads at run time, which this
machine cannot reach, so the events are checked against the trace-event
format here."""
import json
import os
import re
import subprocess

import pytest

import dynmo.perfetto

PHASES = {"X": {"name", "ts", "dur", "pid", "tid"}, "i": {"name", "ts", "pid", "tid", "s"},
          "M": {"name", "pid", "tid", "args"}}


def check_format(trace):
    """The trace-event format's rules the viewers rely on."""
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list)
    for e in trace["traceEvents"]:
        assert e["ph"] in PHASES, e
        missing = PHASES[e["ph"]] - set(e)
        assert not missing, (e, missing)
        if e["ph"] == "X":
            assert e["ts"] >= 0 and e["dur"] >= 0
        if e["ph"] == "i":
            assert e["s"] in ("g", "p", "t")
    json.dumps(trace)  # serialisable as is


def sim(bin_dir, *args):
    r = subprocess.run([os.path.join(bin_dir, "dynmo-sim"), *args], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_simulated_iteration_has_a_track_per_stage_and_pytorch_action_names(bin_dir, tmp_path):
    out = tmp_path / "zb.json"
    sim(bin_dir, "--schedule", "zb-h1", "--microbatches", "6", "--stages", "4", "--fwd", "1",
        "--bwd", "1", "--wgrad", "1", "--perfetto", str(out))
    trace = json.loads(out.read_text())
    check_format(trace)
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == 4 * 6 * 3  # stages x micro-batches x (F, B, W)
    for e in slices:
        m = re.fullmatch(r"PP:(\d+)([FBW])(\d+)", e["name"])
        assert m and int(m.group(1)) == e["tid"] and int(m.group(3)) < 6
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"stage 0", "stage 1", "stage 2", "stage 3"}


def test_a_replay_shows_static_and_dynmo_with_every_plan(bin_dir, tmp_path):
    out = tmp_path / "replay.json"
    j = sim(bin_dir, "--scenario", "dense", "--stages", "8", "--layers", "16",
            "--iterations", "80", "--straggler", "3:0.5:20", "--perfetto", str(out))
    trace = json.loads(out.read_text())
    check_format(trace)
    for tid in (0, 1):
        assert len([e for e in trace["traceEvents"]
                    if e["ph"] == "X" and e["tid"] == tid]) == 80
    instants = [e["name"] for e in trace["traceEvents"] if e["ph"] == "i"]
    applied = [p for p in j["plans"] if p["outcome"] == "applied"]
    assert applied, "the straggler draws a plan"
    assert len(instants) == len(j["plans"]) + len(applied)


def test_a_run_log_becomes_a_timeline(tmp_path):
    records = []
    for it in range(6):
        records.append({"iter": it, "loss": 1.0, "tokens_per_s": 100.0, "iteration_s": 0.5,
                        "boundaries": [0, 2, 4] if it < 3 else [0, 3, 4],
                        "epoch": 0 if it < 3 else 1, "microbatches": 4,
                        "layer_forward_s": [0.01, 0.02, 0.03, 0.04],
                        "layer_backward_s": [0.02, 0.04, 0.06, 0.08],
                        "model_changed": it == 1})
    log = tmp_path / "run.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "run.json"
    assert dynmo.perfetto.main([str(log), str(out), "--count", "10"]) == 0
    trace = json.loads(out.read_text())
    check_format(trace)
    per_stage = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] > 0]
    assert len(per_stage) == 6 * 4 * 2  # iterations x layers x (F, B)
    instants = [e["name"] for e in trace["traceEvents"] if e["ph"] == "i"]
    assert instants == ["model changed", "plan applied (epoch 1)"]


def test_bad_logs_are_one_line_errors(tmp_path, capsys):
    assert dynmo.perfetto.main([str(tmp_path / "missing.jsonl"), str(tmp_path / "o.json")]) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"iter": 0}\n')
    assert dynmo.perfetto.main([str(bad), str(tmp_path / "o.json")]) == 2
    assert dynmo.perfetto.main([str(bad), str(tmp_path / "o.json"), "--count", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("dynmo.perfetto:") for line in err)
    with pytest.raises(ValueError):
        dynmo.perfetto.timeline([])
