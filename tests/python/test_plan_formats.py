"""dynmo.plan_formats and dynmo.plan's current / layout_formats: a split as
torchtitan, Megatron-LM and DeepSpeed take it, both ways, with dynmo-plan's
output and messages."""
import itertools
import json
import os
import subprocess

import pytest

import dynmo
from dynmo import plan_formats as pf

# 6 layers: tok_embeddings, layers.0..layers.3, norm + output; the head is
# heavy, so the best split of 2 stages is [0, 4, 6].
PROBLEM = {
    "stages": 2,
    "layers": [{"time": 1, "params": 100, "mem_bytes": 400}]
              + [{"time": 2, "params": 50, "mem_bytes": 200}] * 4
              + [{"time": 3, "params": 100, "mem_bytes": 400}],
    "current": [0, 5, 6],
}


def every_split(layers):
    for k in range(layers):
        for cuts in itertools.combinations(range(1, layers), k):
            yield [0, *cuts, layers]


def test_to_formats_name_embedding_blocks_and_head():
    assert pf.to_torchtitan([0, 3, 6]) == [
        ["tok_embeddings", "layers.0", "layers.1"],
        ["layers.2", "layers.3", "norm", "output"]]
    assert pf.to_megatron([0, 4, 7, 10]) == "Et*3|t*3|t*2,L"  # Megatron's own example
    assert pf.to_deepspeed([0, 4, 7, 10]) == [0, 4, 7, 10]


@pytest.mark.parametrize("layers", range(2, 8))
def test_every_split_round_trips_through_every_format(layers):
    for b in every_split(layers):
        shape = {"num_layers": layers, "num_stages": len(b) - 1}
        assert pf.from_torchtitan(pf.to_torchtitan(b)) == b
        assert pf.from_torchtitan(pf.to_torchtitan(b), **shape) == b
        assert pf.from_megatron(pf.to_megatron(b)) == b
        assert pf.from_megatron(pf.to_megatron(b), **shape) == b
        assert pf.from_deepspeed(pf.to_deepspeed(b), **shape) == b


def test_megatron_layouts_repeat_and_group_as_megatron_reads_them():
    assert pf.from_megatron("Et*3|(tt|)*2,t|L") == [0, 4, 6, 8, 9, 10]
    assert pf.from_megatron("E,t,t|t,t,L") == [0, 3, 6]


def test_torchtitan_accepts_tuples_and_any_order_within_a_part():
    fqns = (("layers.0", "tok_embeddings"), ("output", "norm", "layers.1"))
    assert pf.from_torchtitan(fqns) == [0, 2, 4]


@pytest.mark.parametrize("read, message", [
    (lambda: pf.from_torchtitan([["tok_embeddings", "layers.0"], ["blocks.1", "norm", "output"]]),
     "torchtitan: unknown module 'blocks.1' in model part 1 "
     "(tok_embeddings, layers.<k>, norm, output)"),
    (lambda: pf.from_torchtitan([["tok_embeddings", "layers.1"], ["layers.0", "norm", "output"]]),
     "torchtitan: model part 0 is not contiguous: it holds 'tok_embeddings' and 'layers.1' "
     "but not 'layers.0'"),
    (lambda: pf.from_torchtitan([["tok_embeddings", "layers.0"], ["layers.2", "norm", "output"]]),
     "torchtitan: 'layers.1' is in no model part"),
    (lambda: pf.from_torchtitan([["tok_embeddings", "layers.0"], ["layers.0", "norm", "output"]]),
     "torchtitan: 'layers.0' is in model parts 0 and 1"),
    (lambda: pf.from_torchtitan([["tok_embeddings", "layers.0"], ["norm", "output"]],
                                num_stages=3),
     "torchtitan: 2 model parts; the model has 3 stages"),
    (lambda: pf.from_torchtitan([["tok_embeddings", "layers.0"], ["norm", "output"]],
                                num_layers=5),
     "torchtitan: 'layers.1' is in no model part"),
    (lambda: pf.from_megatron("Et*|L"),
     'Megatron layout "Et*|L" has a \'*\' with no repeat count after it'),
    (lambda: pf.from_megatron("Et*3|(tt|)*2,m|L"),
     "Megatron layout \"Et*3|(tt|)*2,m|L\" holds MTP layers ('m'), which have no DynMo "
     "layer; leave them out"),
    (lambda: pf.from_megatron("Et||L"),
     'Megatron layout "Et||L" leaves stage 1 empty; every stage holds at least one layer'),
    (lambda: pf.from_megatron("Et|t,L", num_stages=4),
     'Megatron layout "Et|t,L" has 2 stages; the model has 4'),
    (lambda: pf.from_deepspeed([0, 2, 2]),
     "parts: boundaries [0,2,2] leave stage 1 empty; they must strictly increase"),
    (lambda: pf.to_megatron([0, 1]),
     "Megatron names an embedding and a head, so it needs at least 2 layers; the model has 1"),
    (lambda: pf.to_torchtitan([0, 3, 2]),
     "boundaries [0,3,2] leave stage 1 empty; they must strictly increase"),
])
def test_a_split_without_boundaries_raises_one_line(read, message):
    with pytest.raises(dynmo.InvalidArgumentError) as e:
        read()
    assert str(e.value) == message
    assert isinstance(e.value, ValueError)


def test_boundaries_must_be_integers():
    with pytest.raises(TypeError):
        pf.to_deepspeed([0, 1.5, 3])
    with pytest.raises(dynmo.InvalidArgumentError, match="must be integers"):
        pf.from_deepspeed([0, 1.5, 3])


def run_plan(bin_dir, args, problem):
    r = subprocess.run([os.path.join(bin_dir, "dynmo-plan"), *args], input=json.dumps(problem),
                       capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr


def test_plan_writes_layout_formats_like_dynmo_plan(bin_dir):
    rc, out, err = run_plan(bin_dir, ["--layout-format=torchtitan,megatron,deepspeed"], PROBLEM)
    assert rc == 0, err
    d = dynmo.plan(PROBLEM, layout_formats=["torchtitan", "megatron", "deepspeed"])
    assert d.raw == json.loads(out)
    assert d.boundaries == [0, 4, 6]
    assert d.module_fqns_per_model_part == pf.to_torchtitan(d.boundaries)
    assert d.pipeline_model_parallel_layout == "Et*3|t,L"
    assert d.parts == [0, 4, 6]
    assert dynmo.plan(PROBLEM, layout_formats="megatron").module_fqns_per_model_part is None


@pytest.mark.parametrize("current", [
    [0, 5, 6], "0,5,6", "Et*4|L",
    [["tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3"], ["norm", "output"]],
    {"pipeline_model_parallel_layout": "Et*4|L"},
])
def test_plan_reads_the_current_split_in_any_format(current):
    want = dynmo.plan(PROBLEM)
    problem = dict(PROBLEM, current=[0, 1, 6])  # replaced by current=
    got = dynmo.plan(problem, current=current)
    assert got == want
    assert [(m.layer, m.from_stage, m.to_stage) for m in got.migrations] == [(4, 0, 1)]


def test_plan_refuses_a_bad_current_split_with_dynmo_plans_message(bin_dir):
    rc, _, err = run_plan(bin_dir, ["--current=Et*4|m|L"], PROBLEM)
    assert rc == 2
    with pytest.raises(dynmo.InvalidArgumentError) as e:
        dynmo.plan(PROBLEM, current="Et*4|m|L")
    assert err == f"dynmo-plan: {e.value}\n"
    assert "MTP layers" in str(e.value)
