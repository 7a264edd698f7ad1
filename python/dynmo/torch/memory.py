"""A module's memory and the per-layer report built from it.

``layer_memory(module, optimizer)`` counts, in bytes, what a layer keeps
between iterations: parameters, their gradients (when allocated), buffers
and the optimizer's state tensors for its parameters (AdamW: exp_avg,
exp_avg_sq, step) — what migrating the layer moves, plus its gradients.
``layer_costs`` combines that with a ``LayerTimer``'s timings into the
``dynmo.LayerCost`` list ``dynmo.Agent.report`` takes, per micro-batch.
Pure functions over tensors; thread-compatible.
"""
from __future__ import annotations

import os
from typing import List, Mapping, Optional, Tuple

import torch
from torch import nn

from dynmo.torch.timing import LayerTiming
from dynmo.types import LayerCost


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def layer_memory(module: nn.Module,
                 optimizer: Optional[torch.optim.Optimizer] = None) -> Tuple[int, int]:
    """(parameter count, resident bytes) of ``module``."""
    params = 0
    resident = 0
    for p in module.parameters():
        params += p.numel()
        resident += tensor_bytes(p)
        if p.grad is not None:
            resident += tensor_bytes(p.grad)
        if optimizer is not None:
            for v in optimizer.state.get(p, {}).values():
                if isinstance(v, torch.Tensor):
                    resident += tensor_bytes(v)
    for b in module.buffers():
        resident += tensor_bytes(b)
    return params, resident


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



def ranks_sharing_device(local_world_size: int, visible: int, index: int) -> int:
    """Local ranks on device ``index`` of ``visible`` when ``local_world_size``
    local ranks spread round-robin (local rank r on device r % visible); at
    least 1. The same arithmetic as the trainer's ``comm/device_share.h``."""
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


def _local_ranks() -> int:
    for var in ("LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        v = os.environ.get(var, "")
        if v.isdigit() and int(v) > 0:
            return int(v)
    return 1


def device_memory(device: torch.device, local_world_size: Optional[int] = None,
                  reset_peak: bool = True) -> Tuple[int, int]:
    """(used, capacity) of this rank's CUDA device as ``honest_rank_memory``
    computes them, the peak since the last call (``reset_peak``); (0, 0) on
    a CPU. ``local_world_size`` defaults to the ranks on this host as the
    trainer counts them: LOCAL_WORLD_SIZE, else WORLD_SIZE, else 1."""
    if device.type != "cuda":
        return 0, 0
    if local_world_size is None:
        local_world_size = _local_ranks()
    index = device.index if device.index is not None else torch.cuda.current_device()
    free, total = torch.cuda.mem_get_info(index)
    reserved = torch.cuda.memory_reserved(index)
    peak = torch.cuda.max_memory_reserved(index)
    if reset_peak:
        torch.cuda.reset_peak_memory_stats(index)
    sharing = ranks_sharing_device(local_world_size, torch.cuda.device_count(), index)
    return honest_rank_memory(int(total), int(free), int(reserved), int(peak), sharing)
