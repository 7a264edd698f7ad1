"""dynmo.pipelining with FSDP2 (``data_parallel="fsdp2"``) on CPU over Gloo,
pp 2 x dp 2: every layer ``fully_shard``ed over its stage's two replicas.
A run whose layers DynMo moves (each replica's shards to its peer replica,
with their optimizer state) and a run saved at one split and resumed at
another are compared with the static FSDP2 run of the same model and
data: every micro-batch's loss and every layer's final (gathered) weights
bit-identical. A shard offered a layer sharded otherwise is refused with
nothing changed."""
import json
import tempfile

import pytest

torch = pytest.importorskip("torch")

import pipelining_workers as w  # noqa: E402
from conftest import run_ranks  # noqa: E402
from test_pipelining import losses, same_training, weights  # noqa: E402

FSDP = dict(schedule="1F1B", pp=2, dp=2, steps=6, microbatches=2, data_parallel="fsdp2")
# Layers go one way, then further the other; saved after both, at 0,6,8.
PLANS = {"1": [[0, 4, 8], [0, 2, 8]], "2": [[0, 2, 8], [0, 6, 8]]}
SAVED_AT, RESUMED_AT = [0, 6, 8], [0, 3, 8]

_runs = {}


def run(cfg):
    """The 4-rank run of ``cfg`` (cached: the tests share runs)."""
    key = json.dumps(cfg, sort_keys=True)
    if key not in _runs:
        _runs[key] = run_ranks(w.train, cfg, 4)
    return _runs[key]


@pytest.fixture(scope="module")
def checkpoints():
    with tempfile.TemporaryDirectory() as root:
        yield root


def moved_and_saved(root):
    return run(dict(FSDP, plans=PLANS, save_at=3, save_root=root))


def test_fsdp2_replicas_move_their_shards_and_train_bit_identically(checkpoints):
    static = run(FSDP)
    moved = moved_and_saved(checkpoints)
    assert all(not r["errors"] for r in moved), [r["errors"] for r in moved]
    assert all(r["boundaries"][-1] == SAVED_AT for r in moved)
    assert len({k for k, d, _ in losses(moved) if d == 1}) == 6  # replica 1 trained too
    # Every rank moved its own shards: each layer's bytes once over the two
    # replicas of a stage, not once per replica.
    assert all(r["moved"] > 0 for r in moved)
    assert moved[0]["moved"] == moved[1]["moved"] and moved[2]["moved"] == moved[3]["moved"]
    same_training(static, moved)


def test_fsdp2_checkpoint_saved_at_one_split_resumes_at_another(checkpoints):
    # Saved at 0,6,8 after two plans (DCP: each replica writes its shards
    # under the model's FQNs), resumed by new processes at 0,3,8: DCP
    # re-shards every layer onto the replicas that hold it now.
    whole = moved_and_saved(checkpoints)
    from dynmo.pipelining import checkpoint
    path = checkpoint.latest(checkpoints)
    assert path.endswith("step-3") and checkpoint.saved_split(path) == SAVED_AT
    resumed = run(dict(FSDP, boundaries=RESUMED_AT, resume=checkpoints))
    assert all(not r["errors"] for r in resumed), [r["errors"] for r in resumed]
    after = [x for x in losses(whole) if x[0] > 3]
    assert after and losses(resumed) == after
    assert weights(resumed) == weights(whole)


def test_fsdp2_bad_input_is_one_clear_error():
    # One rank, in this process: the checks run before anything is built.
    import os
    import torch.distributed as dist
    from dynmo.pipelining import DynamicPipeline
    with tempfile.TemporaryDirectory() as root:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(root, 'init')}",
                                rank=0, world_size=1)
        try:
            c = w.lm.LlamaConfig(dim=8, n_layers=2, n_heads=2, n_kv_heads=1, ffn_hidden=8,
                                 seq_len=4)

            def build(model, **kwargs):
                return DynamicPipeline(model, n_microbatches=1, loss_fn=w.lm.loss_fn, pp=1,
                                       optimizer=torch.optim.SGD, **kwargs)

            with pytest.raises(ValueError, match="data_parallel must be 'ddp' or 'fsdp2', "
                                                 "got 'zero'"):
                build(w.lm.Transformer(c), schedule="1F1B", data_parallel="zero")
            with pytest.raises(ValueError, match="InterleavedZeroBubble with data_parallel "
                                                 "'fsdp2' is not supported yet"):
                build(w.lm.Transformer(c), schedule="InterleavedZeroBubble",
                      data_parallel="fsdp2")
            tied = w.lm.Transformer(c)
            tied.output.weight = tied.tok_embeddings.weight
            with pytest.raises(ValueError, match="tied parameters .* with data_parallel "
                                                 "'fsdp2' are not supported yet"):
                build(tied, schedule="1F1B", data_parallel="fsdp2")
        finally:
            dist.destroy_process_group()


def test_a_shard_offered_a_plain_layer_is_refused_and_changes_nothing():
    # The receiver names the mismatch, the sender hears that its layer did
    # not land; both can train on with the layout they had.
    sender, receiver = run_ranks(w.sharded_into_plain, {}, 2)
    (why, recoverable), = receiver["errors"]
    assert "the layer received is sharded unlike this rank's" in why and recoverable
    (why, recoverable), = sender["errors"]
    assert "migration not applied, nothing changed" in why and recoverable
    assert sender["kept"]  # its optimizer still holds the layer's parameters
