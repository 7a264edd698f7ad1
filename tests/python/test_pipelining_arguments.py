"""The adapter's input (issue 43): every ``DynamicPipeline`` refusal is one
``dynmo.InvalidArgumentError`` (a ValueError) naming the argument, types
are checked (a boundary is an int: not a float, a string or a bool), the
user's model is left as it was by a constructor that fails, an
unreachable coordinator is one line after its connect timeout, and
examples/torch/llama_pipelining.py refuses bad flags before any process
group starts: one line, exit status 2."""
import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

from conftest import SOURCE_DIR  # noqa: E402

sys.path.insert(0, os.path.join(SOURCE_DIR, "examples", "torch"))

EXAMPLE = os.path.join(SOURCE_DIR, "examples", "torch", "llama_pipelining.py")


@pytest.fixture
def one_rank(tmp_path):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/init", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def _model():
    import llama_model as lm
    torch.manual_seed(0)
    return lm.Transformer(lm.LlamaConfig(dim=32, n_layers=4, n_heads=4, n_kv_heads=2,
                                         ffn_hidden=64, seq_len=16))


def _pipe(model=None, **overrides):
    import llama_model as lm
    from dynmo.pipelining import DynamicPipeline
    kwargs = dict(schedule="1F1B", n_microbatches=2, loss_fn=lm.loss_fn, pp=1,
                  optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3))
    kwargs.update(overrides)
    return DynamicPipeline(model if model is not None else _model(), **kwargs)


def _snapshot(model):
    return {name: (id(m), {k: v.clone() for k, v in m.state_dict(keep_vars=False).items()})
            for name, m in model.named_children()}


@pytest.mark.parametrize("argument,value,says", [
    ("boundaries", [0, 4.9, 6], "boundaries must be integers, got 4.9 (float)"),
    ("boundaries", ["0", "3", "6"], "boundaries must be integers, got '0' (str)"),
    ("boundaries", [0, True, 6], "boundaries must be integers, got True (bool)"),
    ("boundaries", "0,3,6", "boundaries must be a list of integers, got str"),
    ("boundaries", [0, 6, 6], "boundaries 0,6,6 must be 2 increasing integers"),
    ("n_microbatches", True, "n_microbatches must be an integer, got True (bool)"),
    ("n_microbatches", 0, "n_microbatches must be >= 1, got 0"),
    ("pp", "1", "pp must be an integer, got '1' (str)"),
    ("dp", 0, "dp must be >= 1, got 0"),
    ("stages_per_rank", 1.5, "stages_per_rank must be an integer"),
    ("schedule", 3, "schedule must be a schedule's name, got int"),
    ("schedule", "Zigzag", "Unknown schedule name 'Zigzag'"),
    ("optimizer", None, "optimizer must be callable, got NoneType"),
    ("loss_fn", "mse", "loss_fn must be callable, got str"),
    ("lr_scheduler", 3, "lr_scheduler must be callable, got int"),
    ("device", 7, "device must be a torch.device or its name, got int"),
    ("device", "tpu:x", "device 'tpu:x'"),
    ("coordinator", "nowhere", "coordinator must be None, 'embedded' or 'HOST:PORT', "
                               "got 'nowhere'"),
    ("coordinator", 5, "coordinator must be None, 'embedded' or 'HOST:PORT', got int"),
    ("job", "a job", "job 'a job' must be a name of [A-Za-z0-9._-]"),
    ("policy", ["trigger"], "policy must be a dict of dynmo.set_policy keywords, got list"),
    ("coordinator_flags", "--trigger=manual", "coordinator_flags must be a list of strings"),
    ("first", ["tok_embeddings", 3], "first must be a list of strings"),
    ("timing", 1, "timing must be True or False, got 1"),
    ("migration_timeout_s", 0, "migration_timeout_s must be > 0, got 0"),
    ("migration_timeout_s", float("nan"), "migration_timeout_s must be > 0, got nan"),
    ("connect_timeout_s", True, "connect_timeout_s must be > 0, got True"),
    ("speed_probe_every", -1, "speed_probe_every must be >= 0 (0: never), got -1"),
    ("planned_iterations", 2.0, "planned_iterations must be an integer, got 2.0 (float)"),
    ("data_parallel", "zero3", "data_parallel must be 'ddp' or 'fsdp2', got 'zero3'"),
    ("blocks", "layerz", "model: blocks='layerz'"),
    ("plan_agreement", "lagged", "plan_agreement must be one of auto, early, boundary, "
                                 "got 'lagged'"),
    ("plan_agreement", None, "plan_agreement must be one of auto, early, boundary, got None"),
])
def test_a_refused_argument_is_one_invalid_argument_error_naming_it(one_rank, argument, value,
                                                                   says):
    import dynmo
    model = _model()
    before = _snapshot(model)
    with pytest.raises(dynmo.InvalidArgumentError) as e:
        _pipe(model, **{argument: value})
    assert isinstance(e.value, ValueError)
    assert e.value.code == "INVALID_ARGUMENT"
    text = str(e.value)
    assert text.startswith("dynmo.pipelining: ") and "\n" not in text, text
    assert says in text, text
    after = _snapshot(model)
    assert before.keys() == after.keys()
    for name, (ident, state) in before.items():
        assert after[name][0] == ident
        assert all(torch.equal(state[k], after[name][1][k]) for k in state)


def test_an_early_agreement_the_embedded_plan_lead_would_starve_is_refused(one_rank):
    import dynmo
    with pytest.raises(dynmo.InvalidArgumentError) as e:
        _pipe(coordinator="embedded", plan_agreement="early",
              coordinator_flags=["--plan_lead_iterations=2"])
    assert "plan_agreement 'early' needs the coordinator's plan lead >= 3, got " \
           "--plan_lead_iterations=2" in str(e.value)


@pytest.mark.parametrize("data_parallel", ["ddp", "fsdp2"])
def test_a_constructor_that_fails_late_leaves_the_model_whole(one_rank, data_parallel):
    # Under FSDP2 the failure comes after the layers were sharded: the
    # user's modules are neither FSDP units nor hold DTensors afterwards.
    from torch.distributed.fsdp import FSDPModule

    def refusing_optimizer(params):
        raise RuntimeError("no optimizer today")

    model = _model()
    before = _snapshot(model)
    classes = {name: type(m) for name, m in model.named_modules()}
    params = {name: id(p) for name, p in model.named_parameters()}
    with pytest.raises(RuntimeError, match="no optimizer today"):
        _pipe(model, optimizer=refusing_optimizer, data_parallel=data_parallel)
    after = _snapshot(model)
    assert {n: i for n, (i, _) in after.items()} == {n: i for n, (i, _) in before.items()}
    for name, (_, state) in before.items():
        assert all(type(after[name][1][k]) is torch.Tensor and torch.equal(v, after[name][1][k])
                   for k, v in state.items()), name
    assert {name: type(m) for name, m in model.named_modules()} == classes
    assert not any(isinstance(m, FSDPModule) for m in model.modules())
    assert {name: id(p) for name, p in model.named_parameters()} == params
    assert len(model.layers) == 4
    pipe = _pipe(model, data_parallel=data_parallel)  # and it still builds a pipeline
    assert sorted(pipe.held_layers()) == list(range(6))
    pipe.close()


def test_an_unreachable_coordinator_is_one_line_after_its_connect_timeout(one_rank):
    import dynmo
    with socket_nobody_listens() as address:
        start = time.monotonic()
        with pytest.raises(dynmo.UnavailableError) as e:
            _pipe(coordinator=address, connect_timeout_s=1.0)
        took = time.monotonic() - start
    text = str(e.value)
    assert "\n" not in text and f"cannot reach the DynMo coordinator at {address} within " \
                                  f"1.0 s" in text, text
    assert took < 10, took


class socket_nobody_listens:
    """A loopback address bound but not listening (connections refused)."""

    def __enter__(self):
        import socket
        self._s = socket.socket()
        self._s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{self._s.getsockname()[1]}"

    def __exit__(self, *exc):
        self._s.close()


@pytest.mark.parametrize("flags,says", [
    (["--dp", "0"], "--dp must be >= 1, got 0"),
    (["--heads", "3"], "--heads 3 must divide --dim 128 into even head sizes"),
    (["--kv_heads", "3"], "--kv_heads 3 must divide --heads 4"),
    (["--seq_len", "0"], "--seq_len must be >= 1, got 0"),
    (["--log_json", "/nonexistent/x.jsonl"], "--log_json /nonexistent/x.jsonl: cannot write "
                                              "in /nonexistent"),
    (["--dp", "abc"], "argument --dp: invalid int value: 'abc'"),
    (["--initial_boundaries", "0,4.9,10"], "--initial_boundaries must be integers"),
])
def test_the_example_refuses_bad_flags_in_one_line_before_it_starts(flags, says):
    env = dict(os.environ, WORLD_SIZE="2", RANK="0")
    r = subprocess.run([sys.executable, EXAMPLE, "--coordinator=none", "--device=cpu", *flags],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"llama_pipelining: {says}"), r.stderr
