"""dynmo.pipelining on CPU over Gloo: a torch.distributed.pipelining job
re-split live. Every run is compared with the static run of the same
model and data: the losses of every micro-batch and the final weights of
every layer must be bit-identical wherever the layers went."""
import json
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")

import pipelining_workers as w  # noqa: E402
from conftest import run_ranks  # noqa: E402


def run(cfg, world):
    return run_ranks(w.train, cfg, world)


def losses(records):
    """(iteration, replica, micro-batch losses) of every last stage, in order."""
    return sorted(tuple((k, d, tuple(v))) for r in records for k, d, v in r["losses"])


def weights(records):
    out = {}
    for r in records:
        for layer, v in r["weights"].items():
            out.setdefault(int(layer), set()).add(v)
    return out


def same_training(a, b):
    assert losses(a) == losses(b)
    assert weights(a) == weights(b)


_static = {}


def static_run(cfg, world):
    """The static run of ``cfg`` (cached: several tests compare with it)."""
    key = json.dumps(cfg, sort_keys=True)
    if key not in _static:
        _static[key] = run(cfg, world)
    return _static[key]


# Two moves per run: layers go one way, then come back further the other.
TWO_STAGES = {"1": [[0, 4, 8], [0, 2, 8]], "3": [[0, 2, 8], [0, 6, 8]]}
FOUR_STAGES = {"1": [[0, 2, 4, 6, 8], [0, 1, 4, 7, 8]], "3": [[0, 1, 4, 7, 8], [0, 3, 5, 6, 8]]}


@pytest.mark.parametrize("schedule,plans", [
    ("GPipe", TWO_STAGES), ("1F1B", TWO_STAGES),
    ("Interleaved1F1B", FOUR_STAGES), ("LoopedBFS", FOUR_STAGES),
    ("InterleavedZeroBubble", FOUR_STAGES)])
def test_migrations_both_ways_train_bit_identically(schedule, plans):
    cfg = dict(schedule=schedule, pp=2, steps=4)
    static = static_run(cfg, 2)
    moved = run(dict(cfg, plans=plans), 2)
    assert all(not r["errors"] for r in moved), [r["errors"] for r in moved]
    final = plans["3"][1]
    assert all(r["boundaries"][-1] == final for r in moved)
    assert all(r["boundaries"][0] != final for r in moved)
    assert sum(r["moved"] for r in moved) > 0
    same_training(static, moved)
    assert all(r["opt_groups"] == 1 for r in moved)  # the scheduler's groups stay aligned
    # Every layer a rank holds is timed; zero-bubble schedules time W apart.
    assert sorted(i for r in moved for i in r["layer_s"]) == list(range(moved[0]["layers"]))
    # (Which layers got W time, not how much: no clock decides a test.)
    # Each rank measured time outside its layers (its exchanges) every
    # iteration on CPU (which amount: a clock, not a test's business).
    assert all(r["exchange_s"] > 0 for r in moved)
    w_timed = sorted({i for r in moved for i in r["wgrad_layers"]})
    assert w_timed == (list(range(moved[0]["layers"])) if "ZeroBubble" in schedule else [])


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "amsgrad"])
def test_any_optimizers_state_travels(optimizer):
    cfg = dict(schedule="1F1B", pp=2, steps=4, optimizer=optimizer)
    same_training(static_run(cfg, 2), run(dict(cfg, plans=TWO_STAGES), 2))


def test_exchanges_are_timed_when_the_loop_steps_the_schedule_itself():
    # torchtitan's loop (and examples/torch/llama_pipelining.py) calls
    # pipe.schedule.step, not pipe.step: the exchanges are measured alike, and
    # the moves train as the static run does.
    cfg = dict(schedule="1F1B", pp=2, steps=4, own_step=True)
    moved = run(dict(cfg, plans=TWO_STAGES), 2)
    assert all(not r["errors"] for r in moved), [r["errors"] for r in moved]
    assert all(r["exchange_s"] > 0 for r in moved)
    same_training(static_run(dict(cfg, own_step=False), 2), moved)


def test_data_parallel_replicas_apply_the_same_plan_with_freezing():
    # pp 2 x dp 2: DDP per stage, rebuilt after the moves and when freezing
    # changes which parameters train.
    cfg = dict(schedule="1F1B", pp=2, dp=2, steps=6, dynamism="freezing")
    static = static_run(cfg, 4)
    moved = run(dict(cfg, plans={"2": [[0, 4, 8], [0, 2, 8]], "4": [[0, 2, 8], [0, 5, 8]]}), 4)
    assert all(r["boundaries"][-1] == [0, 5, 8] for r in moved)
    assert len({k for k, d, _ in losses(moved) if d == 1}) == 6  # replica 1 trained too
    same_training(static, moved)


def test_interleaved_virtual_stages_with_data_parallel():
    # 4 virtual stages on pp 2 x dp 2: each replica moves its own copies, a
    # move between two stages of one rank moves nothing.
    cfg = dict(schedule="Interleaved1F1B", pp=2, dp=2, steps=3)
    moved = run(dict(cfg, plans={"1": FOUR_STAGES["1"]}), 4)
    assert all(r["boundaries"][-1] == FOUR_STAGES["1"][1] for r in moved)
    same_training(static_run(cfg, 4), moved)


def test_repack_releases_a_rank_and_training_goes_on_identically():
    # The middle stage is released, then the two that stay re-split again
    # (stage ids stay the original ones: 0 and 2).
    cfg = dict(schedule="1F1B", pp=3, steps=5)  # even start: 0,2,5,8
    static = static_run(cfg, 3)
    packed = run(dict(cfg, plans={
        "2": [[0, 2, 5, 8], [0, 4, 8], [0, 1, 2], [0, 2], [1]],
        "3": [[0, 4, 8], [0, 6, 8], [0, 2], [0, 2]]}), 3)
    assert all(not r["errors"] for r in packed), [r["errors"] for r in packed]
    assert [r["released"] for r in packed] == [False, True, False]
    assert packed[0]["boundaries"][-1] == [0, 6, 8]
    assert losses(packed) == losses(static)
    # Every layer's final weights, wherever they ended up.
    assert weights(packed) == weights(static)
    assert packed[1]["weights"] == {}


def test_a_plan_naming_a_missing_layer_changes_nothing():
    cfg = dict(schedule="1F1B", pp=2, steps=4)
    bad = run(dict(cfg, plans={"1": [[0, 4, 8], [0, 4, 9]]}), 2)
    assert all("lacks" in r["errors"][0] or "boundaries" in r["errors"][0] for r in bad), \
        [r["errors"] for r in bad]
    assert all(r["boundaries"][-1] == [0, 4, 8] for r in bad)
    same_training(static_run(cfg, 2), bad)


def test_a_reshape_plan_is_refused_and_changes_nothing():
    cfg = dict(schedule="1F1B", pp=2, steps=3)
    reshape = {"pipeline_size": 1, "data_parallel_size": 2, "copy_bytes": 0}
    refused = run(dict(cfg, plans={"1": [[0, 4, 8], [0, 4, 8], None, None, (), reshape]}), 2)
    assert all("re-shaping to pp 1 x dp 2 needs a restart" in r["errors"][0] for r in refused)
    same_training(static_run(cfg, 2), refused)


def test_embedded_coordinator_rebalances_a_skewed_start_and_survives_its_loss():
    cfg = dict(schedule="1F1B", pp=2, steps=14, boundaries=[0, 7, 8])
    static = static_run(cfg, 2)
    # No speed probe: under ctest -j2 four ranks share two cores, and the
    # start's probes may publish a real, passing difference between them
    # that prices the split otherwise; the skew here is the layers' count.
    live = run(dict(cfg, coordinator="embedded", policy={"trigger": "every:2"},
                    speed_probe_every=0), 2)
    assert all(not r["errors"] for r in live)
    assert live[0]["plans"], "no plan applied"
    assert live[0]["boundaries"][-1] != [0, 7, 8]
    same_training(static, live)
    # The coordinator dies at iteration 1, before any plan: training goes on
    # statically, unchanged.
    lost = run(dict(cfg, coordinator="embedded", policy={"trigger": "every:2"},
                    kill_coordinator_at=1), 2)
    assert all(r["boundaries"][-1] == [0, 7, 8] for r in lost)
    same_training(static, lost)


def test_bad_input_is_one_clear_error():
    from torch import nn
    from dynmo.pipelining import ModelLayout, schedule_class

    class NotTorchtitan(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(2, 2)])

    with pytest.raises(TypeError, match="looked for torchtitan's model.tok_embeddings, found "
                                        "no attribute model.tok_embeddings"):
        ModelLayout(NotTorchtitan())
    with pytest.raises(ValueError, match="Unknown schedule name 'Zigzag'"):
        schedule_class("Zigzag")
    with pytest.raises(ValueError, match="abstract base class"):
        schedule_class("PipelineScheduleMulti")
    records = run(dict(schedule="ZBVZeroBubble", pp=2, steps=1), 2)
    assert all("cannot run over Gloo" in r["errors"][0] for r in records)
    records = run(dict(schedule="InterleavedZeroBubble", pp=2, dp=2, steps=1), 4)
    assert all("DDP does not average the gradients its W actions compute" in r["errors"][0]
               for r in records)
    records = run(dict(schedule="1F1B", pp=2, steps=1, boundaries=[0, 8, 8]), 2)
    assert all("boundaries 0,8,8 must be 3 increasing integers" in r["errors"][0]
               for r in records)


def _annotated(path, line, kind):
    """Whether python/<path>:<line> carries ``host-sync(kind)`` on it or on
    one of the three lines above (scripts/host-syncs.py's rule)."""
    from conftest import SOURCE_DIR
    lines = open(os.path.join(SOURCE_DIR, "python", path)).read().split("\n")
    return any(f"host-sync({kind})" in lines[i] for i in range(max(0, line - 4), line))


def test_the_steady_state_iteration_never_waits_on_the_device():
    # A clock that completes marks one iteration late, as CUDA events do on
    # a GPU that runs behind the host, and a watch on every blocking read
    # DynMo's own code makes: from iteration 2 on, outside the iterations a
    # plan applies at, no mark is read before it is done, nothing waits, and
    # every read left is of a CPU tensor (annotated host-sync(cpu)). The
    # coordinator still gets each iteration's costs, one iteration late, and
    # decides from them.
    cfg = dict(schedule="1F1B", pp=2, steps=12, boundaries=[0, 7, 8])
    live = run(dict(cfg, coordinator="embedded", policy={"trigger": "every:2"},
                    lagging_clock=True), 2)
    assert all(not r["errors"] for r in live), [r["errors"] for r in live]
    assert all(r["violations"] == [] for r in live), [r["violations"] for r in live]
    sites = {(p, n, m) for r in live for p, n, m in r["blocking"]}
    assert any(m == "tolist" for _, _, m in sites), "the watch saw no read at all"
    assert all(_annotated(p, n, "cpu") for p, n, _ in sites), sorted(sites)
    assert all(measured == step - 1 for r in live for step, measured in r["lag"]), \
        [r["lag"] for r in live]
    assert live[0]["plans"], "no plan applied from lagged costs"
    same_training(static_run(cfg, 2), live)


@pytest.mark.parametrize("schedule,plans", [("1F1B", TWO_STAGES),
                                            ("Interleaved1F1B", FOUR_STAGES)])
def test_tied_embeddings_stay_one_parameter_across_stages(schedule, plans):
    # tie_word_embeddings: layer 0's embedding and the last layer's head are
    # one matrix. On two ranks each keeps a copy; their gradients are summed
    # before every step, so the copies stay equal bit for bit and train as
    # the one shared matrix does on a single rank.
    cfg = dict(schedule=schedule, pp=2, steps=4, tied=True)
    static = static_run(cfg, 2)
    moved = run(dict(cfg, plans=plans), 2)
    assert all(not r["errors"] for r in moved), [r["errors"] for r in moved]
    same_training(static, moved)
    copies = {h for r in moved for h in r["tied"]}
    assert len(copies) == 1 and sum(len(r["tied"]) for r in moved) == 2
    one_rank = run(dict(cfg, schedule="1F1B", pp=1), 1)  # one stage: no self-sends
    for (k, d, a), (_, _, b) in zip(losses(one_rank), losses(moved)):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6), k


@pytest.mark.parametrize("dp,saved_at,resumed_at", [(1, [0, 2, 8], [0, 6, 8]),
                                                     (1, [0, 6, 8], [0, 2, 8]),
                                                     (2, [0, 2, 8], [0, 5, 8])])
def test_a_checkpoint_saved_at_one_split_resumes_at_another(dp, saved_at, resumed_at):
    # Saved after two plans (torch.distributed.checkpoint under the model's
    # own FQNs: weights, optimizer state and groups, LR scheduler, RNG),
    # resumed by a new set of processes at another split: every loss from the
    # resume on and every final weight equal the uninterrupted run's.
    with tempfile.TemporaryDirectory() as root:
        plans = {"1": [[0, 4, 8], [0, 6, 8]], "3": [[0, 6, 8], saved_at]}
        cfg = dict(schedule="1F1B", pp=2, dp=dp, steps=7, plans=plans)
        whole = run(dict(cfg, save_at=4, save_root=root), 2 * dp)
        from dynmo.pipelining import checkpoint
        path = checkpoint.latest(root)
        assert path.endswith("step-4") and checkpoint.saved_split(path) == saved_at
        resumed = run(dict(schedule="1F1B", pp=2, dp=dp, steps=7, boundaries=resumed_at,
                           resume=root), 2 * dp)
    assert all(not r["errors"] for r in resumed), [r["errors"] for r in resumed]
    after = [x for x in losses(whole) if x[0] > 4]
    assert after and losses(resumed) == after
    assert weights(resumed) == weights(whole)
