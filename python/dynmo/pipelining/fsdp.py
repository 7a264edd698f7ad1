"""FSDP2 (``torch.distributed.fsdp.fully_shard``) as the data-parallel
dimension of a ``DynamicPipeline`` (``data_parallel="fsdp2"``).

torchtitan's layout: every module of every held layer is its own FSDP
unit over the stage's data-parallel group (its replicas), sharded on dim 0
(``Shard(0)``), and each stage's chunk is a root unit over them, which is
what the ``PipelineStage`` wraps: the schedule then turns gradient
reduction off for all micro-batches but the last and reduce-scatters once
(``PipelineStage.perform_reduce_grad``). Parameters and the optimizer's
state are DTensors holding this replica's shard.

A layer is sharded once, when it comes to a rank (built, or received by a
migration into an empty layer sharded first); it keeps its FSDP unit as it
changes chunks. At construction the units are sharded copies of the
user's modules (``sharded_copy``), so a constructor that fails after this
step leaves the user's model whole; the cost is that the user's layers
stay allocated beside their shards until the pipeline is built (a
transient (1 + 1/dp)x of the held layers), then the originals go.

Every replica group has the same size and every layer the
same placement, so replica ``r`` of any stage holds the same shard of a
layer as replica ``r`` of any other: a migration moves each replica's
shard to its peer replica (``dynmo.torch.migration`` carries a DTensor's
local shard and re-wraps it in the receiver's mesh), and the layer's full
state moves once, split over the replicas, with no gather.

FSDP2 sets the root of a module tree at its first forward and keeps it;
a chunk rebuilt after a plan is a new root over units that had another,
so ``shard_chunk`` first returns those units to the state of units never
run (``_forget_root``: private attributes of torch 2.11's FSDP2, checked
there). Not thread-safe: the training thread.
"""
from __future__ import annotations

import copy
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard

# Parameters stay gathered from a micro-batch's forward to the last
# backward, as torchtitan does under pipeline parallelism: resharding after
# every forward would all-gather once per micro-batch and pass.
_RESHARD_AFTER_FORWARD = False


def replica_mesh(group: Optional[dist.ProcessGroup], device: torch.device) -> DeviceMesh:
    """The 1-D mesh of one stage's replicas (``group``: the stage's
    data-parallel group, a group of one rank when dp is 1)."""
    return DeviceMesh.from_group(group, device.type, mesh_dim_names=("dp",))


def shard_layer(modules: Sequence[nn.Module], mesh: DeviceMesh) -> None:
    """Makes each of a layer's modules an FSDP unit over ``mesh`` (in place:
    its parameters become DTensors holding this replica's shard). Build
    the optimizer over the parameters afterwards."""
    for m in modules:
        if not isinstance(m, FSDPModule) and any(True for _ in m.parameters()):
            fully_shard(m, mesh=mesh, reshard_after_forward=_RESHARD_AFTER_FORWARD)


def sharded_copy(modules: Sequence[nn.Module], mesh: DeviceMesh) -> List[nn.Module]:
    """Copies of a layer's ``modules`` (one copy of the list: what they
    share stays shared), each made an FSDP unit over ``mesh``; ``modules``
    are left as they were."""
    copies = copy.deepcopy(list(modules))
    shard_layer(copies, mesh)
    return copies


def shard_chunk(chunk: nn.Module, layers: Sequence[Sequence[nn.Module]],
                mesh: DeviceMesh) -> nn.Module:
    """``chunk`` (a stage's module over ``layers``, each already sharded) as
    the FSDP root over its layers' units; returns it."""
    for modules in layers:
        for m in modules:
            if isinstance(m, FSDPModule):
                _forget_root(m)
    fully_shard(chunk, mesh=mesh, reshard_after_forward=_RESHARD_AFTER_FORWARD)
    return chunk


def _forget_root(module: FSDPModule) -> None:
    """Returns ``module``'s FSDP state to the one ``fully_shard`` left (no
    root yet), keeping its shards: the next root's first forward adopts it."""
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPCommContext
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPStateContext
    state = fully_shard.state(module)
    for name in ("_is_root", "_state_ctx", "_comm_ctx"):
        if not hasattr(state, name):
            raise RuntimeError(f"dynmo.pipelining: this torch's FSDP2 state has no {name}; "
                               f"data_parallel='fsdp2' was written against torch 2.11")
    if state._is_root is None:
        return  # never run: nothing to forget
    state._is_root = None
    state._state_ctx = FSDPStateContext()
    state._comm_ctx = FSDPCommContext()
    group = state._fsdp_param_group
    if group is not None:
        group.comm_ctx = state._comm_ctx
        group._module_fqn = None  # named again by the next root
