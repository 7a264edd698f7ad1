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
first+len-1`` as an ``nn.ModuleList``. ``apply_plan`` executes the plan's
moves in their listed order (rounds in which no stage takes part twice, so
blocking send/recv pairs cannot deadlock): the giving stage sends the
layer (``send_layer``) and drops it, the taking stage builds an empty layer
with ``build_layer(layer_id)`` (under ``torch.random.fork_rng``, so training's
random stream is untouched) and receives into it. Afterwards the stage
must hold exactly the plan's range, else ``RuntimeError``. Re-packing plans
(released stages) are refused with ``ValueError``. Not thread-safe.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from dynmo.torch.migration import recv_layer, send_layer
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
    held, total, squares = t.tolist()
    return plan is not None and held == w and total == w * e and squares == w * e * e


def _device_for_backend(backend: str) -> torch.device:
    """Where a collective of a group with ``backend`` runs: the CPU when one
    of its backends takes CPU tensors ("gloo", "mpi", "cpu:gloo,cuda:nccl"),
    else this process's current CUDA device (NCCL takes only CUDA tensors,
    on the device torch.distributed's own collectives use)."""
    names = backend.lower()
    if "gloo" in names or "mpi" in names or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def apply_plan(plan: Plan, layers: StageLayers,
               optimizer: Optional[torch.optim.Optimizer],
               build_layer: Callable[[int], nn.Module],
               rank_of_stage: Callable[[int], int] = lambda s: s,
               group: Optional[dist.ProcessGroup] = None) -> int:
    """Carries out ``plan``'s moves for this stage; returns the bytes moved
    (sent + received) by this rank."""
    if plan.released_stages:
        raise ValueError(f"plan epoch {plan.epoch} releases stages "
                         f"{plan.released_stages}: re-packing is not supported here")
    held = layers.by_id()
    moved = 0
    for move in plan.migrations:
        if move.from_stage == layers.stage:
            if move.layer not in held:
                raise RuntimeError(f"plan epoch {plan.epoch} moves layer {move.layer} "
                                   f"from stage {layers.stage}, which does not hold it")
            moved += send_layer(held.pop(move.layer), optimizer,
                                rank_of_stage(move.to_stage), group)
        elif move.to_stage == layers.stage:
            with torch.random.fork_rng(devices=[]):
                module = build_layer(move.layer)
            moved += recv_layer(module, optimizer, rank_of_stage(move.from_stage), group)
            held[move.layer] = module
    want = list(plan.layers_of(layers.stage))
    if sorted(held) != want:
        raise RuntimeError(f"plan epoch {plan.epoch}: stage {layers.stage} holds layers "
                           f"{sorted(held)} after its moves, the plan says {want}")
    layers.first = want[0]
    layers.modules = nn.ModuleList(held[i] for i in want)
    return moved
