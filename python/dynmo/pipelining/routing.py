"""``ExpertCounts``: how many tokens each expert of this rank's MoE blocks
took in an iteration, read from the model's own counters.

A torchtitan MoE module (``torchtitan.models.moe.MoE``, in its DeepSeek-V3,
Qwen3 MoE and Llama 4 blocks) adds the tokens its router sent to each
expert to its ``tokens_per_expert`` buffer in every forward; torchtitan's
load-balancing hook reads the buffer and zeroes it before the optimizer
step. Any module with a tensor buffer of that name is counted the same way.
The counts are taken around each ``schedule.step`` (the buffers' values
before and after it), so they are the step's tokens whether or not a hook
zeroes the buffers later, and whatever was left in them before; several
steps in an iteration add up. Forwards without autograd are left out: the
first step after every (re)build runs one per stage on zeros (torch's
shape inference), which the model's own counters do count. With activation
checkpointing the recomputed forward counts again (torchtitan's own
counters double as well).

``take`` hands the iteration's counts over as one host tensor: on a GPU a
copy into pinned memory that does not block, to be read once the device
has passed a mark recorded after it (``CostMeter`` reads them with the
layer times of the same iteration, lagged alike); on the CPU the tensor
itself. Nothing here waits on the device.

What the counts are for: the coordinator plans from each layer's measured
time, which already contains whatever the routing costs on that device
(docs/python.md, "MoE models"); the counts say why a block's time moved.
Not thread-safe: the training thread.
"""
from __future__ import annotations

import itertools
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

COUNTER = "tokens_per_expert"  # torchtitan's buffer name


class ExpertCounts:
    """The ``tokens_per_expert`` counters of the layers attached."""

    def __init__(self) -> None:
        self._counters: List[Tuple[int, nn.Module]] = []  # (layer, module), layer order
        self._before: Optional[torch.Tensor] = None
        self._sum: Optional[torch.Tensor] = None
        self._handles: List[torch.utils.hooks.RemovableHandle] = []
        self._open: Optional[torch.Tensor] = None  # a no-grad forward's counter before it

    @property
    def layers(self) -> List[int]:
        """The attached layers that hold a counter, in order."""
        return sorted({layer for layer, _ in self._counters})

    def attach(self, layers: Dict[int, Sequence[nn.Module]]) -> None:
        """Counts these layers' (id -> modules) counters from now on."""
        for h in self._handles:
            h.remove()
        self._counters = [(layer, m) for layer in sorted(layers) for top in layers[layer]
                          for m in top.modules()
                          if isinstance(m._buffers.get(COUNTER), torch.Tensor)]
        offsets = itertools.accumulate([0] + [m._buffers[COUNTER].numel()
                                              for _, m in self._counters])
        self._handles = [h for (_, m), offset in zip(self._counters, offsets) for h in (
            m.register_forward_pre_hook(self._untrained_begins()),
            m.register_forward_hook(self._untrained_ends(offset)))]
        self._before = None
        self._sum = None

    def step_begins(self) -> None:
        if self._counters:
            self._before = self._values()

    def step_ends(self) -> None:
        if self._before is None:
            return
        step = self._values() - self._before
        self._sum = step if self._sum is None else self._sum + step
        self._before = None

    def take(self) -> Optional[Tuple[List[Tuple[int, int]], torch.Tensor]]:
        """The counts since the last ``take`` (None when no step ran with a
        counter): (layer, experts) per counter and the counts, flat, on the
        host — on a GPU still being copied (see the module doc)."""
        counts, self._sum = self._sum, None
        if counts is None:
            return None
        shape = [(layer, m._buffers[COUNTER].numel()) for layer, m in self._counters]
        if counts.device.type == "cpu":
            return shape, counts
        host = torch.empty(counts.shape, dtype=counts.dtype, pin_memory=True)
        host.copy_(counts, non_blocking=True)
        return shape, host

    @staticmethod
    def read(taken: Tuple[List[Tuple[int, int]], torch.Tensor]) -> Dict[int, Tuple[int, ...]]:
        """Tokens per expert by layer (a layer with several counters: theirs
        in module order, one after the other); the copy must be done."""
        shape, host = taken
        # host-sync(cpu): a host tensor (on a GPU, pinned memory whose copy
        # the device has passed: CostMeter reads it after its mark is done).
        flat = [int(round(x)) for x in host.tolist()]
        out: Dict[int, Tuple[int, ...]] = {}
        at = 0
        for layer, n in shape:
            out[layer] = out.get(layer, ()) + tuple(flat[at:at + n])
            at += n
        return out

    def _untrained_begins(self):
        def hook(module, args):
            if not torch.is_grad_enabled() and self._before is not None:
                self._open = module._buffers[COUNTER].detach().flatten().clone()
        return hook

    def _untrained_ends(self, offset: int):
        def hook(module, args, output):
            if self._open is not None:
                # Raise the baseline by what this forward added: it drops
                # out of the step's difference.
                added = module._buffers[COUNTER].detach().flatten() - self._open
                self._before[offset:offset + added.numel()] += added
                self._open = None
        return hook

    def _values(self) -> torch.Tensor:
        return torch.cat([m._buffers[COUNTER].detach().flatten().to(torch.float32)
                          for _, m in self._counters])
