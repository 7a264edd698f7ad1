"""Applying a coordinator plan to a pipeline stage.

    plan = agent.plan_to_apply_at(k)                   # None on most ranks' k
    if agree_on_plan(plan):                            # collective, every rank
        apply_plan(plan, stage_layers, optimizer, rank_of_stage)
        agent.acknowledge(plan.epoch, True)
    elif plan is not None:
        agent.acknowledge(plan.epoch, False, "not every rank holds it")

``agree_on_plan`` is the in-band agreement of docs/protocol.md: every rank
contributes (holds?, epoch, epoch²) to one SUM all-reduce, and the plan
applies only when every rank holds the same epoch (MIN == MAX). A COMMIT
that reached only some ranks in time then changes nothing anywhere.

``StageLayers`` is what one stage holds: global layer ids ``first ..
first+len-1`` as an ``nn.ModuleList``. ``apply_plan`` checks that the
stage would hold exactly the plan's range after its moves (else
``RuntimeError``, nothing sent), builds an empty layer for each layer it
takes with ``build_layer(layer_id)`` (under ``torch.random.fork_rng``, so
training's random stream is untouched), and hands the moves to
``dynmo.torch.migration.migrate``: batched per round, confirmed by every
rank before a sender lets go, bounded by ``timeout_s``. Re-packing plans
(released stages) are refused with ``ValueError``. Not thread-safe.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from dynmo.torch.migration import DEFAULT_TIMEOUT_S, Transfer, migrate
from dynmo.types import Plan


class StageLayers:
    """A stage's contiguous layers: ``modules[i]`` is global layer ``first + i``."""

    def __init__(self, stage: int, first: int, modules: Iterable[nn.Module]) -> None:
        self.stage = stage
        self.first = first
        self.modules = nn.ModuleList(modules)

    @property
    def layer_ids(self) -> List[int]:
        return list(range(self.first, self.first + len(self.modules)))

    def by_id(self) -> Dict[int, nn.Module]:
        return dict(zip(self.layer_ids, self.modules))


def agree_on_plan(plan: Optional[Plan], group: Optional[dist.ProcessGroup] = None,
                  device: Optional[torch.device] = None) -> bool:
    """True on every rank when every rank of ``group`` holds this epoch.

    A collective: every rank calls it at the same iteration boundary. The
    agreement tensor lives on ``device``, by default where ``group``'s
    backend takes tensors (NCCL refuses CPU tensors)."""
    if device is None:
        device = _device_for_backend(str(dist.get_backend(group)))
    e = float(plan.epoch) if plan is not None else 0.0
    t = torch.tensor([1.0 if plan is not None else 0.0, e, e * e], dtype=torch.float64,
                     device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    w = float(dist.get_world_size(group))
    # host-sync(cpu): dynmo.pipelining agrees over its CPU (Gloo) control
    # group; a caller passing an NCCL group pays one sync per iteration here.
    held, total, squares = t.tolist()
    return plan is not None and held == w and total == w * e and squares == w * e * e


def _device_for_backend(backend: str) -> torch.device:
    """Where a collective of a group with ``backend`` runs: the CPU when one
    of its backends takes CPU tensors ("gloo", "mpi", "cpu:gloo,cuda:nccl"),
    else this process's current CUDA device (NCCL takes only CUDA tensors,
    on the device torch.distributed's own collectives use)."""
    if takes_cpu_tensors(backend) or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def takes_cpu_tensors(backend: str) -> bool:
    """Whether a group of ``backend`` takes CPU tensors ("gloo", "mpi",
    "cpu:gloo,cuda:nccl")."""
    names = backend.lower()
    return "gloo" in names or "mpi" in names


def apply_plan(plan: Plan, layers: StageLayers,
               optimizer: Optional[torch.optim.Optimizer],
               build_layer: Callable[[int], nn.Module],
               rank_of_stage: Callable[[int], int] = lambda s: s,
               group: Optional[dist.ProcessGroup] = None, *,
               timeout_s: float = DEFAULT_TIMEOUT_S,
               lr_scheduler: Optional[object] = None) -> int:
    """Carries out ``plan``'s moves for this stage; returns the bytes moved
    (sent + received) by this rank. Every rank of ``group`` calls it (the
    plan is confirmed by all): ``MigrationError`` on every rank, nothing
    changed, when a move did not land."""
    if plan.released_stages:
        raise ValueError(f"plan epoch {plan.epoch} releases stages "
                         f"{plan.released_stages}: re-packing is not supported here")
    held = layers.by_id()
    for move in plan.migrations:
        if move.from_stage == layers.stage and move.layer not in held:
            raise RuntimeError(f"plan epoch {plan.epoch} moves layer {move.layer} "
                               f"from stage {layers.stage}, which does not hold it")
    want = list(plan.layers_of(layers.stage))
    after = set(held) - {m.layer for m in plan.migrations if m.from_stage == layers.stage}
    after |= {m.layer for m in plan.migrations if m.to_stage == layers.stage}
    if sorted(after) != want:
        raise RuntimeError(f"plan epoch {plan.epoch}: stage {layers.stage} holds layers "
                           f"{sorted(after)} after its moves, the plan says {want}")
    transfers = []
    for move in plan.migrations:
        if move.from_stage == layers.stage:
            modules = [held[move.layer]]
        elif move.to_stage == layers.stage:
            with torch.random.fork_rng(devices=[]):
                modules = [build_layer(move.layer)]
        else:
            continue
        transfers.append(Transfer(move.layer, rank_of_stage(move.from_stage),
                                  rank_of_stage(move.to_stage), modules, move.round))
    rank = dist.get_rank()
    device = next((p.device for m in held.values() for p in m.parameters()),
                  _device_for_backend(str(dist.get_backend(group))))
    done = migrate(transfers, optimizer, rank=rank, device=device, group=group,
                   epoch=plan.epoch, timeout_s=timeout_s, lr_scheduler=lr_scheduler)
    for move in plan.migrations:
        if move.from_stage == layers.stage:
            held.pop(move.layer)
    for layer, modules in done.received.items():
        held[layer] = modules[0]
    layers.first = want[0]
    layers.modules = nn.ModuleList(held[i] for i in want)
    return done.bytes
