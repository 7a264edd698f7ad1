"""dynmo.plan / simulate / replay give what dynmo-plan and dynmo-sim print,
and fail with their messages."""
import json
import math
import os
import subprocess

import pytest

import dynmo

PROBLEM = {
    "stages": 2,
    "layers": [{"time": 1, "params": 10, "mem_bytes": 100},
               {"time": 2, "params": 10, "mem_bytes": 100},
               {"time": 3, "params": 10, "mem_bytes": 100},
               {"time": 1, "params": 10, "mem_bytes": 100}],
    "current": [0, 3, 4],
}


def run_tool(bin_dir, tool, args, stdin=""):
    r = subprocess.run([os.path.join(bin_dir, tool), *args], input=stdin,
                       capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr


@pytest.mark.parametrize("method", ["uniform", "parameters", "time", "optimal", "diffusion"])
def test_plan_matches_dynmo_plan_for_every_method(bin_dir, method):
    rc, out, _ = run_tool(bin_dir, "dynmo-plan", [f"--method={method}"], json.dumps(PROBLEM))
    assert rc == 0
    d = dynmo.plan(PROBLEM, method=method)
    assert d.raw == json.loads(out)
    assert d.method == method
    assert d.boundaries[0] == 0 and d.boundaries[-1] == 4


def test_plan_fields_and_migrations_are_typed():
    d = dynmo.plan(PROBLEM)
    assert d.boundaries == [0, 2, 4]
    assert d.bottleneck == 4.0
    assert d.migrations == [dynmo.LayerMove(layer=2, from_stage=0, to_stage=1, bytes=100,
                                            round=0)]
    assert d.moved_bytes == 100


def test_plan_accepts_json_text_and_the_shipped_example(source_dir, bin_dir):
    with open(os.path.join(source_dir, "examples", "problem.json")) as f:
        text = f.read()
    rc, out, _ = run_tool(bin_dir, "dynmo-plan", ["--method=optimal", "--repack"], text)
    assert rc == 0
    d = dynmo.plan(text, repack=True)
    assert d.raw == json.loads(out)
    assert d.method == "optimal+repack"
    assert d.active_stages is not None and d.comm_split is not None


def test_first_fit_repack_matches_the_tool(bin_dir):
    args = ["--repack", "--repack-method=first-fit", "--target-stages=1"]
    rc, out, _ = run_tool(bin_dir, "dynmo-plan", args, json.dumps(PROBLEM))
    assert rc == 0
    d = dynmo.plan(PROBLEM, repack=True, repack_method="first-fit", target_stages=1)
    assert d.raw == json.loads(out)
    assert d.layer_owner is not None


BAD_PLANS = [
    ("{bad", {}),
    ({"stages": 0, "layers": [{"time": 1}]}, {}),
    ({"stages": 3, "layers": [{"time": 1}, {"time": 1}]}, {}),
    ({"stages": 1, "layers": [{"time": -1}]}, {}),
    ({"stages": 1, "layers": [{"time": float("nan")}]}, {}),
    ({"stages": 1, "layers": [{"time": math.inf}]}, {}),
    ({"stages": 1, "layers": "x"}, {}),
    ({"stages": 1, "layers": [{"time": 1, "mem_bytes": 10}], "capacity_bytes": [5]}, {}),
    (PROBLEM, {"method": "fastest"}),
    (PROBLEM, {"tolerance": 0.1}),
    (PROBLEM, {"repack": True, "method": "time"}),
    (PROBLEM, {"repack": True, "repack_method": "best"}),
    (PROBLEM, {"method": "diffusion", "rounds": "x"}),
]


def cli_args(kwargs):
    out = []
    for k, v in kwargs.items():
        name = k.replace("_", "-")
        out.append(f"--{name}" if v is True else f"--{name}={v}")
    return out


@pytest.mark.parametrize("problem,kwargs", BAD_PLANS)
def test_bad_problems_raise_dynmo_plans_message(bin_dir, problem, kwargs):
    text = problem if isinstance(problem, str) else json.dumps(problem)
    rc, _, err = run_tool(bin_dir, "dynmo-plan", cli_args(kwargs), text)
    assert rc == 2
    with pytest.raises(dynmo.InvalidArgumentError) as e:
        dynmo.plan(problem, **kwargs)
    assert err.strip() == f"dynmo-plan: {e.value}"
    assert e.value.code == "INVALID_ARGUMENT"
    assert isinstance(e.value, ValueError) and isinstance(e.value, dynmo.DynmoError)


def test_simulate_matches_dynmo_sim(bin_dir):
    args = ["--schedule=1f1b", "--microbatches=4", "--stage-times=1:2:0,1.5:2:0.5", "--comm=0.1"]
    rc, out, _ = run_tool(bin_dir, "dynmo-sim", args)
    assert rc == 0
    r = dynmo.simulate(schedule="1f1b", microbatches=4,
                       stage_times=[(1, 2, 0), (1.5, 2, 0.5)], comm=0.1)
    assert r.raw == json.loads(out)
    assert r.iteration_time > 0 and len(r.stage_idle) == 2 and r.gantt_svg is None


def test_simulate_draws_the_gantt_chart():
    r = dynmo.simulate(schedule="gpipe", microbatches=2, stages=2, fwd=1, bwd=1, wgrad=0,
                       gantt=True)
    assert r.gantt_svg.startswith("<svg") or "<svg" in r.gantt_svg[:200]


@pytest.mark.parametrize("kwargs,args", [
    (dict(schedule="1f1c", microbatches=4, stages=2, fwd=1, bwd=1, wgrad=0),
     ["--schedule=1f1c", "--microbatches=4", "--stages=2", "--fwd=1", "--bwd=1", "--wgrad=0"]),
    (dict(schedule="1f1b", microbatches=0, stages=2, fwd=1, bwd=1, wgrad=0),
     ["--schedule=1f1b", "--microbatches=0", "--stages=2", "--fwd=1", "--bwd=1", "--wgrad=0"]),
    (dict(schedule="1f1b", microbatches=2, stages=2, fwd=-1, bwd=1, wgrad=0),
     ["--schedule=1f1b", "--microbatches=2", "--stages=2", "--fwd=-1", "--bwd=1", "--wgrad=0"]),
    (dict(schedule="1f1b", microbatches=2, stages=2),
     ["--schedule=1f1b", "--microbatches=2", "--stages=2"]),
    (dict(schedule="1f1b", microbatches=2, stage_times=[(1, float("nan"), 0)]),
     ["--schedule=1f1b", "--microbatches=2", "--stage-times=1.0:nan:0.0"]),
])
def test_bad_simulations_raise_dynmo_sims_message(bin_dir, kwargs, args):
    rc, _, err = run_tool(bin_dir, "dynmo-sim", args)
    assert rc == 2
    with pytest.raises(dynmo.InvalidArgumentError) as e:
        dynmo.simulate(**kwargs)
    assert err.strip() == f"dynmo-sim: {e.value}"


def test_replay_of_a_scenario_matches_dynmo_sim(bin_dir):
    args = ["--scenario=moe", "--stages=4", "--iterations=30", "--layers=16", "--seed=3"]
    rc, out, _ = run_tool(bin_dir, "dynmo-sim", args)
    assert rc == 0
    assert dynmo.replay(scenario="moe", stages=4, iterations=30, layers=16, seed=3) == \
        json.loads(out)


def test_replay_of_records_matches_the_shipped_trace_file(source_dir):
    path = os.path.join(source_dir, "examples", "trace-early-exit.jsonl")
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    from_file = dynmo.replay(trace=path, stages=2)
    from_records = dynmo.replay(trace=records, stages=2)
    assert from_records["source"] == "trace:<records>"
    del from_file["source"], from_records["source"]
    assert from_file == from_records


def test_bad_replays_raise():
    with pytest.raises(dynmo.InvalidArgumentError, match="exactly one of --trace"):
        dynmo.replay(stages=2)
    with pytest.raises(dynmo.InvalidArgumentError, match="cannot read"):
        dynmo.replay(trace="/nonexistent/trace.jsonl", stages=2)
    with pytest.raises(dynmo.InvalidArgumentError):
        dynmo.replay(scenario="nope", stages=2)
    with pytest.raises(dynmo.InvalidArgumentError):
        dynmo.replay(trace=[{"iter": 0, "layers": [{"fwd": -1}]}], stages=1)


def test_core_refuses_file_writing_flags_and_stray_arguments():
    from dynmo import _core
    with pytest.raises(dynmo.InvalidArgumentError, match="writes a file"):
        _core.simulate_json(["--schedule=1f1b", "--microbatches=2", "--stages=1",
                             "--fwd=1", "--bwd=1", "--wgrad=0", "--svg=/tmp/x.svg"])
    with pytest.raises(dynmo.InvalidArgumentError, match="unexpected argument"):
        _core.plan_json("{}", ["problem.json"])
    with pytest.raises(dynmo.InvalidArgumentError, match="unknown flag"):
        _core.plan_json("{}", ["--nope"])
    with pytest.raises(dynmo.InvalidArgumentError, match="use replay"):
        _core.simulate_json(["--scenario=moe", "--stages=2"])
