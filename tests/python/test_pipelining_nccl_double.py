"""dynmo.pipelining under NCCL's completion semantics on the CPU: the
migration, re-pack and DDP cases of test_pipelining.py run on the
"nccl-double" backend (dynmo.nccl_double: a receive holds poison until the
Work NCCL would complete is waited on; a batch whose two sides list their
ops differently raises), each bit-identical to the Gloo static run. A
migration that read a tensor before its batch completed, or paired its
batches in different orders on two ranks, fails here as it would on GPUs.
Also the example, launched as a user would with --backend=nccl-double."""
import pytest

pytest.importorskip("torch")

from test_pipelining import (FOUR_STAGES, TWO_STAGES, losses, run,  # noqa: E402
                             same_training, static_run)

DOUBLE = {"backend": "nccl-double"}


@pytest.mark.parametrize("schedule,plans", [("1F1B", TWO_STAGES),
                                            ("Interleaved1F1B", FOUR_STAGES)])
def test_migrations_train_bit_identically_under_nccls_completion(schedule, plans):
    cfg = dict(schedule=schedule, pp=2, steps=4)
    moved = run(dict(cfg, plans=plans, **DOUBLE), 2)
    assert all(not r["errors"] for r in moved), [r["errors"] for r in moved]
    assert all(r["boundaries"][-1] == plans["3"][1] for r in moved)
    same_training(static_run(cfg, 2), moved)


def test_data_parallel_with_freezing_under_nccls_completion():
    cfg = dict(schedule="1F1B", pp=2, dp=2, steps=6, dynamism="freezing")
    moved = run(dict(cfg, plans={"2": [[0, 4, 8], [0, 2, 8]], "4": [[0, 2, 8], [0, 5, 8]]},
                     **DOUBLE), 4)
    assert all(r["boundaries"][-1] == [0, 5, 8] for r in moved)
    same_training(static_run(cfg, 4), moved)


def test_repack_under_nccls_completion():
    cfg = dict(schedule="1F1B", pp=3, steps=5)
    packed = run(dict(cfg, plans={
        "2": [[0, 2, 5, 8], [0, 4, 8], [0, 1, 2], [0, 2], [1]],
        "3": [[0, 4, 8], [0, 6, 8], [0, 2], [0, 2]]}, **DOUBLE), 3)
    assert all(not r["errors"] for r in packed), [r["errors"] for r in packed]
    assert [r["released"] for r in packed] == [False, True, False]
    static = static_run(cfg, 3)
    assert losses(packed) == losses(static)


def test_the_example_on_nccl_double_trains_as_gloo_static(source_dir, bin_dir, tmp_path):
    from test_llama_example import run_example
    start = "--initial_boundaries=0,7,8"
    static, _ = run_example(source_dir, bin_dir, tmp_path, "static", "--coordinator=none",
                            start)
    live, _ = run_example(source_dir, bin_dir, tmp_path, "live", "--backend=nccl-double",
                          "--coordinator=embedded", "--trigger=every:3", start)
    assert [r["loss"] for r in live] == [r["loss"] for r in static]
    applied = [r for r in live if r["plan"]]
    assert applied and applied[0]["boundaries"] != [0, 7, 8] and applied[0]["moved_bytes"] > 0
