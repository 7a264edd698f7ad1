"""Parameters that two layers share (tied embeddings), kept one parameter
however the layers are split.

A model may use one ``nn.Parameter`` in several pipeline layers —
``tie_word_embeddings``: the token embedding (layer 0) and the output head
(the last layer). When those layers sit on different ranks, each rank
holds its own copy. They stay one parameter in effect the way Megatron's
embedding group keeps them: every step, before the optimizer steps, the
copies' gradients are summed — locally over the copies one rank holds, then
by one SUM all-reduce over the ranks that hold a copy (per data-parallel
replica) — and every copy steps with that sum. Copies that start equal,
with optimizer states that start equal, so stay equal bit for bit, and the
sum is the gradient the one shared parameter would have had. A migration
moves a copy like any tensor (values and optimizer state); ``regroup``
follows the layout after every plan.

    ties = find_ties(layer_modules)              # before taking the model apart
    tied = TiedGradients(ties)
    tied.regroup(rank_of_layer, replicas, dp_rank, rank)   # collective (new_group)
    optimizer.register_step_pre_hook(lambda *a: tied.sum(held_layers))

Not thread-safe: the training thread.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn

# Where a copy lives: (layer id, index of the module in the layer, the
# parameter's dotted name in that module).
Slot = Tuple[int, int, str]


@dataclasses.dataclass
class Tie:
    """One parameter used by several layers: its slots, first slot first."""

    slots: List[Slot]

    @property
    def layers(self) -> List[int]:
        return sorted({s[0] for s in self.slots})

    @property
    def name(self) -> str:
        layer, index, path = self.slots[0]
        return f"layer {layer} module {index} {path}"


def find_ties(layer_modules: Dict[int, Sequence[nn.Module]]) -> List[Tie]:
    """The parameters shared by two or more layers, in the model as built."""
    by_param: Dict[int, List[Slot]] = {}
    for layer in sorted(layer_modules):
        for index, module in enumerate(layer_modules[layer]):
            for path, p in module.named_parameters(remove_duplicate=False):
                by_param.setdefault(id(p), []).append((layer, index, path))
    return [Tie(slots) for slots in by_param.values() if len({s[0] for s in slots}) > 1]


def _owner(module: nn.Module, path: str) -> Tuple[nn.Module, str]:
    prefix, _, leaf = path.rpartition(".")
    return (module.get_submodule(prefix) if prefix else module), leaf


class TiedGradients:
    """Sums each tie's gradients over its copies before the optimizer steps."""

    def __init__(self, ties: Sequence[Tie]) -> None:
        self.ties = list(ties)
        self._groups: Dict[Tuple[int, ...], Optional[dist.ProcessGroup]] = {}
        self._mine: List[Optional[dist.ProcessGroup]] = [None] * len(self.ties)

    def regroup(self, rank_of_layer: Callable[[int, int], int], replicas: int,
                dp_rank: int) -> None:
        """Builds, for each tie and replica, the group of the ranks holding a
        copy (``rank_of_layer(layer, replica)``). Collective over the world:
        every rank calls it with the same layout."""
        for i, tie in enumerate(self.ties):
            self._mine[i] = None
            for replica in range(replicas):
                ranks = tuple(sorted({rank_of_layer(layer, replica) for layer in tie.layers}))
                if len(ranks) < 2:
                    continue
                if ranks not in self._groups:
                    self._groups[ranks] = dist.new_group(list(ranks))
                if replica == dp_rank and dist.get_rank() in ranks:
                    self._mine[i] = self._groups[ranks]

    def sum(self, held: Dict[int, Sequence[nn.Module]]) -> None:
        """Every held copy's gradient becomes the sum over all copies."""
        for tie, group in zip(self.ties, self._mine):
            copies: List[nn.Parameter] = []
            for layer, index, path in tie.slots:
                if layer in held:
                    owner, leaf = _owner(held[layer][index], path)
                    p = getattr(owner, leaf)
                    if all(p is not q for q in copies):
                        copies.append(p)
            if not copies or not any(p.requires_grad for p in copies):
                continue
            grads = [p.grad for p in copies if p.grad is not None]
            total = grads[0].clone() if grads else torch.zeros_like(copies[0])
            for g in grads[1:]:
                total += g
            if group is not None:
                dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
            for p in copies:
                if p.grad is None:
                    p.grad = total.clone()
                else:
                    p.grad.copy_(total)
