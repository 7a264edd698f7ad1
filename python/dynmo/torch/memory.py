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

