"""A module's memory, the per-layer report built from it, and a rank's
honest share of its GPU.

``resident_bytes(modules, optimizer)`` counts, in bytes, what layers keep
between iterations at their peak: parameters, one gradient per parameter
that requires one (whether or not ``.grad`` is allocated right now: after
``zero_grad(set_to_none=True)`` it is not, but the next backward allocates
it again), buffers and the optimizer's state tensors for those parameters
(AdamW: exp_avg, exp_avg_sq, step) — what migrating a layer moves, plus its
gradients; of a sharded tensor (FSDP2's DTensor), this rank's shard.
``layer_memory`` and ``layer_costs`` use the same rule;
``layer_costs`` combines it with a ``LayerTimer``'s timings into the
``dynmo.LayerCost`` list ``dynmo.Agent.report`` takes, per micro-batch.

``device_memory`` is what a GPU rank reports instead: the caching
allocator's reserved peak plus its share of what no allocator tracks, and
the device divided among the ranks computing on it — found by device
identity (every rank's CUDA device UUID, exchanged once per process through
the default process group's store), so Slurm's per-task GPU binding (each
rank sees one device, as cuda:0) counts one rank per GPU. The trainer's
``trainer/comm/device_share.h`` is the same arithmetic.

Pure functions over tensors, except ``device_memory`` (reads the device;
its first call on a CUDA rank is a store exchange every rank takes part
in); thread-compatible.
"""
from __future__ import annotations

import datetime
import logging
import os
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from dynmo.torch.timing import LayerTiming
from dynmo.types import LayerCost

_log = logging.getLogger(__name__)


def tensor_bytes(t: torch.Tensor) -> int:
    """The bytes this rank holds of ``t``: of a DTensor (FSDP2), its shard."""
    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size()


def resident_bytes(modules: Sequence[nn.Module],
                   optimizer: Optional[torch.optim.Optimizer] = None) -> int:
    """Bytes ``modules`` hold at their peak between iterations: each distinct
    parameter, its gradient when it requires one (allocated or not), its
    state tensors in ``optimizer``, and every buffer."""
    total = 0
    seen = set()
    for m in modules:
        for p in m.parameters():
            if id(p) in seen:  # a parameter tied between modules is held once
                continue
            seen.add(id(p))
            total += tensor_bytes(p)
            if p.grad is not None:
                total += tensor_bytes(p.grad)
            elif p.requires_grad:
                total += tensor_bytes(p)  # a gradient has its parameter's shape and dtype
            if optimizer is not None:
                for v in optimizer.state.get(p, {}).values():
                    if isinstance(v, torch.Tensor):
                        total += tensor_bytes(v)
        for b in m.buffers():
            if id(b) not in seen:
                seen.add(id(b))
                total += tensor_bytes(b)
    return total


def layer_memory(module: nn.Module,
                 optimizer: Optional[torch.optim.Optimizer] = None) -> Tuple[int, int]:
    """(parameter count, ``resident_bytes``) of ``module``."""
    return sum(p.numel() for p in module.parameters()), resident_bytes([module], optimizer)


def layer_costs(timings: Mapping[int, LayerTiming], modules: Mapping[int, nn.Module],
                optimizer: Optional[torch.optim.Optimizer] = None,
                microbatches: int = 1) -> List[LayerCost]:
    """One ``LayerCost`` per module, times and activations per micro-batch."""
    if microbatches < 1:
        raise ValueError(f"microbatches must be >= 1, got {microbatches}")
    out = []
    for layer in sorted(modules):
        params, resident = layer_memory(modules[layer], optimizer)
        t = timings.get(layer)
        out.append(LayerCost(
            layer=layer,
            fwd_s=t.fwd_s / microbatches if t else 0.0,
            bwd_s=t.bwd_s / microbatches if t else 0.0,
            params=params, resident_bytes=resident,
            activation_bytes=t.activation_bytes // microbatches if t else 0))
    return out


def ranks_on_same_device(uuids: Sequence[str], rank: int) -> int:
    """How many ranks compute on rank ``rank``'s device, itself included,
    given every rank's device UUID in rank order ("" for a rank without
    one): those whose UUID equals its own; 1 when its own is unknown. The
    same rule as the trainer's ``RanksOnSameDevice``."""
    if rank < 0 or rank >= len(uuids) or not uuids[rank]:
        return 1
    return sum(1 for u in uuids if u == uuids[rank])


def ranks_sharing_device(local_world_size: int, visible: int, index: int) -> int:
    """The fallback when device UUIDs cannot be exchanged: local ranks on
    device ``index`` of ``visible`` when ``local_world_size`` local ranks
    spread round-robin (local rank r on device r % visible); at least 1.
    Wrong when each rank sees only its own device (Slurm's per-task
    binding). The trainer's ``RanksSharingDevice``."""
    if visible <= 0 or local_world_size <= 0 or index < 0 or index >= visible:
        return 1
    return max(1, (local_world_size - 1 - index) // visible + 1)


def honest_rank_memory(total: int, free: int, reserved: int, peak_reserved: int,
                       sharing: int) -> Tuple[int, int]:
    """(used, capacity) bytes one rank reports for its GPU: capacity is the
    device over the ranks sharing it; used is the caching allocator's reserved
    peak plus this rank's share of what no caching allocator tracks (the CUDA
    context, NCCL's buffers): (total - free) - reserved x sharing, over
    sharing, never below 0."""
    s = max(1, sharing)
    outside = total - free - reserved * s
    return peak_reserved + max(0, outside) // s, total // s


_UUID_KEY = "dynmo/device_uuid/{}"


def exchange_device_uuids(store: "torch.distributed.Store", rank: int, world_size: int,
                          uuid: str, timeout: datetime.timedelta) -> List[str]:
    """Every rank's device UUID in rank order, through ``store``: this rank
    publishes its own, then waits (at most ``timeout``) for the others and
    reads them in one round trip. A collective over the ``world_size`` ranks
    (each must call it once); host-side only, the GPU is not touched. Raises
    ``torch.distributed.DistStoreError`` on timeout."""
    store.set(_UUID_KEY.format(rank), uuid)
    keys = [_UUID_KEY.format(r) for r in range(world_size)]
    store.wait(keys, timeout)
    return [v.decode() for v in store.multi_get(keys)]


# Per device index: how many ranks share it, learned once per process (which
# ranks compute on which GPU does not change during a job).
_sharing: Dict[int, int] = {}
_published_cpu = False
_warned_fallback = False

# How long the first device_memory call waits for the other ranks' UUIDs
# (they publish theirs at their own first call, at the same iteration).
_EXCHANGE_TIMEOUT = datetime.timedelta(seconds=300)


def _local_ranks() -> int:
    for var in ("LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        v = os.environ.get(var, "")
        if v.isdigit() and int(v) > 0:
            return int(v)
    return 1


def _default_store() -> Optional[Tuple["torch.distributed.Store", int, int]]:
    """(store, rank, world size) of the default process group, or None."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        store = dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):
        return None
    return store, dist.get_rank(), dist.get_world_size()


def _warn_fallback(why: str) -> None:
    global _warned_fallback
    if not _warned_fallback:
        _warned_fallback = True
        _log.warning("dynmo: %s; assuming local ranks spread round-robin over the visible "
                     "GPUs (wrong under per-task GPU binding such as Slurm's "
                     "--gpus-per-task)", why)


def device_sharing(index: int, local_world_size: Optional[int] = None) -> int:
    """How many ranks compute on CUDA device ``index`` (this rank's),
    itself included: by device UUID over the default process group's store
    (exchanged at the first call, then cached). Without a process group, or
    when the exchange times out, the round-robin guess over
    ``local_world_size`` (default: LOCAL_WORLD_SIZE, else WORLD_SIZE, else
    1) and the visible devices, with a warning once."""
    if index in _sharing:
        return _sharing[index]
    group = _default_store()
    if group is not None:
        store, rank, world = group
        if world == 1:
            _sharing[index] = 1
            return 1
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        try:
            uuids = exchange_device_uuids(store, rank, world, uuid, _EXCHANGE_TIMEOUT)
        except RuntimeError as e:  # DistStoreError: a rank never published
            _warn_fallback(f"device UUID exchange failed ({e})")
        else:
            _sharing[index] = ranks_on_same_device(uuids, rank)
            return _sharing[index]
    else:
        _warn_fallback("no torch.distributed process group to exchange device UUIDs over")
    if local_world_size is None:
        local_world_size = _local_ranks()
    sharing = ranks_sharing_device(local_world_size, torch.cuda.device_count(), index)
    if group is not None:
        _sharing[index] = sharing  # the exchange is not tried twice
    return sharing


def _publish_no_device() -> None:
    """A CPU rank's part in the exchange: it has no UUID (so CUDA ranks of a
    mixed group do not wait for it); once, never waiting."""
    global _published_cpu
    if _published_cpu:
        return
    _published_cpu = True
    group = _default_store()
    if group is not None and group[2] > 1:
        group[0].set(_UUID_KEY.format(group[1]), "")


def device_memory(device: torch.device, local_world_size: Optional[int] = None,
                  reset_peak: bool = True) -> Tuple[int, int]:
    """(used, capacity) of this rank's CUDA device as ``honest_rank_memory``
    computes them with ``device_sharing``, the peak since the last call
    (``reset_peak``); (0, 0) on a CPU. Every CUDA rank of the process group
    must make its first call at about the same point (the UUID exchange
    waits for all of them); later calls read the device only (the driver's
    free / total and the allocator's counters, no stream sync).
    ``local_world_size`` matters only to the round-robin fallback."""
    if device.type != "cuda":
        _publish_no_device()
        return 0, 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    sharing = device_sharing(index, local_world_size)
    free, total = torch.cuda.mem_get_info(index)
    reserved = torch.cuda.memory_reserved(index)
    peak = torch.cuda.max_memory_reserved(index)
    if reset_peak:
        torch.cuda.reset_peak_memory_stats(index)
    return honest_rank_memory(int(total), int(free), int(reserved), int(peak), sharing)
