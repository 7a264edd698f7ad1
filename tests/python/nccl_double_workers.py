"""Process bodies for test_nccl_double.py: each runs on one of two ranks of
the "nccl-double" backend (torch.multiprocessing.spawn) and asserts; an
assertion fails the test."""
import copy
import gc

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import dynmo.nccl_double


def init(rank, world, init_file):
    torch.set_num_threads(1)
    assert dynmo.nccl_double.register() == "nccl-double"
    dist.init_process_group("nccl-double", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    assert dist.get_backend() == "nccl-double"


def poisoned(t):
    """Every byte 0xFF: what the double holds in a receive until it delivers."""
    return bool(t.view(torch.uint8).eq(0xFF).all())


def collectives(rank, world, init_file):
    """The collectives go through Gloo and complete at their Work."""
    init(rank, world, init_file)
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((4,), 3.0)), t
    t = torch.full((3,), float(rank))
    dist.all_reduce(t, async_op=True).wait()
    assert torch.equal(t, torch.full((3,), 1.0)), t

    b = torch.arange(5.0) if rank == 0 else torch.zeros(5)
    dist.broadcast(b, src=0)
    assert torch.equal(b, torch.arange(5.0)), b

    out = [torch.empty(2, dtype=torch.long) for _ in range(world)]
    dist.all_gather(out, torch.full((2,), rank, dtype=torch.long))
    assert [o.tolist() for o in out] == [[0, 0], [1, 1]], out
    flat = torch.empty(2 * world)
    dist.all_gather_into_tensor(flat, torch.full((2,), float(rank)))
    assert flat.tolist() == [0.0, 0.0, 1.0, 1.0], flat
    objects = [None] * world
    dist.all_gather_object(objects, {"rank": rank})
    assert objects == [{"rank": 0}, {"rank": 1}], objects

    r = torch.full((1,), float(rank + 1))
    dist.reduce(r, dst=0)
    if rank == 0:
        assert r.item() == 3.0, r
    gathered = [torch.empty(2) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.full((2,), float(rank)), gathered, dst=0)
    if rank == 0:
        assert [g.tolist() for g in gathered] == [[0.0, 0.0], [1.0, 1.0]], gathered
    part = torch.empty(2)
    dist.scatter(part, [torch.full((2,), 5.0 + i) for i in range(world)] if rank == 0 else None,
                 src=0)
    assert part.tolist() == [5.0 + rank] * 2, part
    mine = torch.empty(2)
    dist.reduce_scatter_tensor(mine, torch.arange(4.0) + rank)
    assert mine.tolist() == [1.0 + 4 * rank, 3.0 + 4 * rank], mine
    swapped = torch.empty(2)
    dist.all_to_all_single(swapped, torch.tensor([10.0 * rank, 10.0 * rank + 1]))
    assert swapped.tolist() == [float(rank), 10.0 + rank], swapped
    dist.barrier()
    dist.destroy_process_group()


def point_to_point(rank, world, init_file):
    """Receives hold poison until the Work NCCL would complete is waited on:
    an irecv's own, a batch's one; batches that do not pair are refused on
    both ranks; object lists go through."""
    init(rank, world, init_file)
    peer = 1 - rank

    if rank == 0:
        dist.send(torch.arange(6.0), dst=1)
    else:
        got = torch.zeros(6)
        dist.recv(got, src=0)
        assert torch.equal(got, torch.arange(6.0)), got

    if rank == 0:
        dist.isend(torch.full((3,), 7.0), dst=1).wait()
    else:
        got = torch.zeros(3)
        work = dist.irecv(got, src=0)
        assert poisoned(got) and torch.isnan(got).all(), got
        work.wait()
        assert torch.equal(got, torch.full((3,), 7.0)), got

    # One coalesced batch each way (torch's _coalescing_manager calls the
    # double's startCoalescing / endCoalescing): read before the batch's
    # Work is waited on, the receives are poison; after, the peer's data.
    values = torch.linspace(0, 1, 5) + rank
    count = torch.tensor([10 + rank])
    got_values = torch.zeros(5)
    got_count = torch.zeros(1, dtype=torch.long)
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, values, peer), dist.P2POp(dist.isend, count, peer),
        dist.P2POp(dist.irecv, got_values, peer), dist.P2POp(dist.irecv, got_count, peer)])
    assert len(works) == 1, works
    assert poisoned(got_values) and torch.isnan(got_values).all(), got_values
    assert got_count.item() == -1, got_count
    for w in works:
        w.wait()
    assert torch.equal(got_values, torch.linspace(0, 1, 5) + peer), got_values
    assert got_count.item() == 10 + peer, got_count

    # Rank 0 sends 4 floats then 8; rank 1 receives 8 then 4.
    small, large = torch.zeros(4), torch.zeros(8)
    ops = ([dist.P2POp(dist.isend, small, 1), dist.P2POp(dist.isend, large, 1)] if rank == 0
           else [dist.P2POp(dist.irecv, large, 0), dist.P2POp(dist.irecv, small, 0)])
    try:
        dist.batch_isend_irecv(ops)
    except dist.DistBackendError as e:
        assert ("rank 0's send #0 to rank 1 carries 16 bytes of Float, rank 1's receive #0 "
                "from rank 0 expects 32 bytes of Float") in str(e), e
    else:
        raise AssertionError("a batch that does not pair was delivered")

    # The group is whole after the refusal: objects (a size, then bytes).
    if rank == 0:
        dist.send_object_list([{"layers": [1, 2]}, "stage"], dst=1)
    else:
        objects = [None, None]
        dist.recv_object_list(objects, src=0)
        assert objects == [{"layers": [1, 2]}, "stage"], objects
    dist.barrier()
    dist.destroy_process_group()


def groups(rank, world, init_file):
    """dist.new_group(..., backend="nccl-double") builds the double again."""
    init(rank, world, init_file)
    peer = 1 - rank
    pair = dist.new_group([0, 1], backend="nccl-double")
    assert dist.get_backend(pair) == "nccl-double"
    t = torch.full((2,), float(rank + 1))
    dist.all_reduce(t, group=pair)
    assert torch.equal(t, torch.full((2,), 3.0)), t
    got = torch.zeros(3)
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, torch.full((3,), float(rank)), peer, group=pair),
        dist.P2POp(dist.irecv, got, peer, group=pair)])
    assert poisoned(got), got
    works[0].wait()
    assert torch.equal(got, torch.full((3,), float(peer))), got

    solo = dist.new_group([0], backend="nccl-double")  # every rank calls it
    if rank == 0:
        one = torch.ones(1)
        dist.all_reduce(one, group=solo)
        assert one.item() == 1.0, one
    dist.barrier(group=pair)
    dist.destroy_process_group()


def _model():
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                         nn.Linear(8, 1))


def ddp(rank, world, init_file):
    """DistributedDataParallel over the double: rank 0's weights broadcast at
    construction, gradients all-reduced, the replicas equal to one model
    trained on both ranks' batches."""
    init(rank, world, init_file)
    torch.manual_seed(0)
    reference = _model()  # rank 0's initial weights
    torch.manual_seed(rank)
    model = nn.parallel.DistributedDataParallel(_model())
    for p, q in zip(model.module.parameters(), reference.parameters()):
        assert torch.equal(p, q), "DDP did not broadcast rank 0's weights"
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(5)
    for _ in range(3):
        xs = [torch.randn(6, 4, generator=g) for _ in range(world)]
        ys = [torch.randn(6, 1, generator=g) for _ in range(world)]
        opt.zero_grad()
        F.mse_loss(model(xs[rank]), ys[rank]).backward()
        opt.step()
        ref_opt.zero_grad()
        (sum(F.mse_loss(reference(x), y) for x, y in zip(xs, ys)) / world).backward()
        ref_opt.step()
    for p, q in zip(model.module.parameters(), reference.parameters()):
        assert torch.allclose(p, q, atol=1e-6), (p, q)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    both = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(both, flat)
    assert torch.equal(both[0], both[1]), "the replicas differ"
    # DDP sits in a reference cycle that keeps the group alive into the
    # interpreter's shutdown, where a Gloo worker thread that drops the
    # all-gather's Work (Python-owned tensors) cannot take the GIL and
    # aborts the process (plain Gloo too, 1 run in ~5). Freeing the group
    # here joins those threads while Python still runs.
    del model, opt
    gc.collect()
    dist.destroy_process_group()


def pipeline(rank, world, init_file):
    """torch.distributed.pipelining over the double: PipelineStage's shape
    inference (object lists) and ScheduleGPipe's batches give the gradients
    of the whole model trained in one process."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    init(rank, world, init_file)
    torch.manual_seed(0)
    whole = _model()
    reference = copy.deepcopy(whole)
    part = whole[:2] if rank == 0 else whole[2:]
    stage = PipelineStage(part, rank, world, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=F.mse_loss)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(4, 4, generator=g), torch.randn(4, 1, generator=g)
    if rank == 0:
        schedule.step(x)
    else:
        losses = []
        schedule.step(target=y, losses=losses)
        assert len(losses) == 2, losses
    F.mse_loss(reference(x), y).backward()
    mine = reference[:2] if rank == 0 else reference[2:]
    for p, q in zip(part.parameters(), mine.parameters()):
        assert p.grad is not None and torch.allclose(p.grad, q.grad, atol=1e-6), (p.grad, q.grad)
    dist.barrier()
    dist.destroy_process_group()
