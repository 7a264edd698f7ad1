"""Process bodies for test_torch.py: each runs on one of two Gloo ranks
(torch.multiprocessing.spawn) and asserts; an assertion fails the test."""
import gc

import torch
import torch.distributed as dist
from torch import nn

import dynmo
import dynmo.torch as dt


def init(rank, world, init_file):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)


def teardown():
    """Ends the process group once no Gloo worker thread still holds one of
    this process's tensors: a work's last reference dropped on a Gloo thread
    while Python shuts down aborts the process ("terminate called without an
    active exception", seen with plain Gloo async works too)."""
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def layer(i):
    torch.manual_seed(1000 + i)
    return nn.Sequential(nn.Linear(6, 6), nn.LayerNorm(6))


def train(modules, optimizer, steps, seed=7):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(3, 6, generator=g)
        for m in modules:
            x = m(x)
        x.square().sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def migrate_one_layer(rank, world, init_file):
    """Rank 0 sends a trained layer with its AdamW state; rank 1's copy is
    bit-identical to a reference trained in place, and keeps training alike."""
    init(rank, world, init_file)
    ref = layer(0)
    ref.register_buffer("counter", torch.arange(4, dtype=torch.int64))
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.01)
    train([ref], ref_opt, 3)
    if rank == 0:
        keep = nn.Linear(2, 2)
        opt = torch.optim.AdamW(list(keep.parameters()) + list(ref.parameters()), lr=0.01)
        for p in ref.parameters():
            opt.state[p] = ref_opt.state[p]
        sent = dt.send_layer(ref, opt, 1)
        assert sent > 0
        assert all(p not in opt.state for p in ref.parameters())
        assert sum(len(g["params"]) for g in opt.param_groups) == 2  # keep's only
    else:
        fresh = layer(5)
        fresh.register_buffer("counter", torch.zeros(4, dtype=torch.int64))
        opt = torch.optim.AdamW(nn.Linear(2, 2).parameters(), lr=0.01)
        received = dt.recv_layer(fresh, opt, 0)
        assert received > 0
        for a, b in zip(list(fresh.parameters()) + list(fresh.buffers()),
                        list(ref.parameters()) + list(ref.buffers())):
            assert same(a, b)
        for p, q in zip(fresh.parameters(), ref.parameters()):
            for key in ("exp_avg", "exp_avg_sq", "step"):
                assert same(opt.state[p][key], ref_opt.state[q][key]), key
        # The sender's group 0 has the same hyper-parameters as this rank's:
        # the layer joins it (the scheduler's per-group lists stay aligned).
        assert len(opt.param_groups) == 1
        assert {id(p) for p in fresh.parameters()} <= {id(p) for p in opt.param_groups[0]["params"]}
        train([fresh], opt, 2, seed=9)
        train([ref], ref_opt, 2, seed=9)
        for a, b in zip(fresh.parameters(), ref.parameters()):
            assert same(a, b)
    teardown()


def apply_a_plan(rank, world, init_file):
    """Stage 0 holds layers 0-2, stage 1 layer 3; a plan moves layer 2."""
    init(rank, world, init_file)
    plan = dynmo.Plan(job="t", epoch=4, apply_iteration=10, boundaries=[0, 2, 4],
                      active_stages=[0, 1], released_stages=[],
                      migrations=[dynmo.LayerMove(2, 0, 1, 0, 0)], split=[],
                      migration_bytes=0, predicted_bottleneck_s=0, previous_bottleneck_s=0,
                      reason="test", decided_unix_nanos=0, commit_with_prepare=False)
    assert dt.agree_on_plan(plan)
    assert not dt.agree_on_plan(plan if rank == 0 else None)
    assert not dt.agree_on_plan(None)
    reference = [layer(i) for i in range(4)]
    ref_opt = torch.optim.AdamW(nn.ModuleList(reference).parameters(), lr=0.01)
    train(reference, ref_opt, 2)
    mine = range(0, 3) if rank == 0 else range(3, 4)
    stage = dt.StageLayers(rank, mine[0], (reference[i] for i in mine))
    opt = torch.optim.AdamW(stage.modules.parameters(), lr=0.01)
    for p in stage.modules.parameters():
        opt.state[p] = ref_opt.state[p]
    moved = dt.apply_plan(plan, stage, opt, layer)
    assert moved > 0
    assert stage.layer_ids == ([0, 1] if rank == 0 else [2, 3])
    for i, m in stage.by_id().items():
        for a, b in zip(m.parameters(), reference[i].parameters()):
            assert same(a, b)
            assert same(opt.state[a]["exp_avg"], ref_opt.state[b]["exp_avg"])
    held = {id(p) for p in stage.modules.parameters()}
    assert {id(p) for g in opt.param_groups for p in g["params"]} == held
    teardown()


def early_agreement(rank, world, init_file):
    """dynmo.pipelining's EarlyAgreement: the agreement on boundary k+1's
    plan is started at boundary k from what each rank held then; the
    BoundaryAgreement agrees on what each holds at the boundary itself."""
    import datetime

    from dynmo.pipelining.plan_agreement import BoundaryAgreement, EarlyAgreement
    init(rank, world, init_file)
    group = dist.group.WORLD
    plan = dynmo.Plan(job="t", epoch=4, apply_iteration=6, boundaries=[0, 2, 4],
                      active_stages=[0, 1], released_stages=[], migrations=[], split=[],
                      migration_bytes=0, predicted_bottleneck_s=0, previous_bottleneck_s=0,
                      reason="test", decided_unix_nanos=0, commit_with_prepare=False)
    asked = []

    def held_by_every_rank(k):
        asked.append(k)
        return plan if k == 6 else None

    def rank1_commits_late(k):  # rank 1 holds nothing at boundary 5, the plan at 6
        asked.append(k)
        return plan if k == 6 and (rank == 0 or len(asked) > 1) else None

    a = EarlyAgreement()
    # The first boundary agrees at once, on the plan due there.
    assert a.agree(5, held_by_every_rank, group) == (None, False)
    assert asked == [5]
    # Started at boundary 5 for 6, read at 6 without asking again.
    a.start_next(6, held_by_every_rank, group)
    assert a.agree(6, held_by_every_rank, group) == (plan, True)
    assert asked == [5, 6]
    # A rank whose commit came after boundary 5 held nothing there: no rank
    # applies at 6, whatever it holds by then.
    asked.clear()
    b = EarlyAgreement()
    b.start_next(6, rank1_commits_late, group)
    got, agreed = b.agree(6, rank1_commits_late, group)
    assert not agreed and got == (plan if rank == 0 else None)
    assert asked == [6]
    # The same late commit at the boundary itself: every rank holds it by 6.
    asked.clear()
    c = BoundaryAgreement()
    c.start_next(6, rank1_commits_late, group)  # nothing started, nothing asked
    assert asked == []
    if rank == 1:
        rank1_commits_late(5)  # boundary 5 passed without the commit
    assert c.agree(6, rank1_commits_late, group) == (plan, True)
    # A boundary not reached from the one before agrees at once.
    asked.clear()
    b.start_next(7, held_by_every_rank, group)
    assert b.agree(6, held_by_every_rank, group) == (plan, True)
    assert asked == [7, 6]
    # A close waits for the one in flight.
    b.start_next(7, held_by_every_rank, group)
    b.settle(datetime.timedelta(seconds=30))
    assert b.agree(7, held_by_every_rank, group) == (None, False)  # at once: none in flight
    teardown()
