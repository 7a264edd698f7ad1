"""How a torchtitan-style model maps onto DynMo's pipeline layers.

A torchtitan model keeps its transformer blocks in an ``nn.ModuleDict``
keyed by layer id (``model.layers["0"]`` ...) and has modules before and
after them that only the first and the last stage hold (the token embedding;
the final norm and the output head). Its ``forward`` skips whichever of them
is ``None``, which is how torchtitan splits one model into stages.

DynMo numbers the pipeline layers 0 .. N+1: layer 0 is the ``first`` modules
(``tok_embeddings``), layers 1..N the blocks in the ModuleDict's order,
layer N+1 the ``last`` modules (``norm``, ``output``). A stage holds a
contiguous range ``[b[s], b[s+1])`` of them (coordinator/core's boundaries).

``ModelLayout`` checks a model's form and names each layer's modules (their
FQNs, which stay the model's own so checkpoints keep their keys).
``ModelParts`` takes the model apart: the live modules this rank holds, a
meta-device skeleton of every layer (to build an empty layer that receives a
migrated one) and the shell (the model without its layers: its ``forward``
and top-level buffers such as RoPE tables), from which ``chunk`` builds the
``nn.Module`` a ``PipelineStage`` wraps. Not thread-safe: the training thread.
"""
from __future__ import annotations

import copy
from typing import Dict, Iterable, List, Sequence

import torch
from torch import nn


class ModelLayout:
    """The layer ids of a torchtitan-style model and their modules' FQNs."""

    def __init__(self, model: nn.Module, blocks: str = "layers",
                 first: Sequence[str] = ("tok_embeddings",),
                 last: Sequence[str] = ("norm", "output")) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"dynmo.pipelining: the model must be an nn.Module, "
                            f"got {type(model).__name__}")
        holder = getattr(model, blocks, None)
        if not isinstance(holder, nn.ModuleDict):
            raise TypeError(
                f"dynmo.pipelining: model.{blocks} must be an nn.ModuleDict keyed by layer "
                f"id (torchtitan's layout), got {type(holder).__name__}")
        if len(holder) == 0:
            raise ValueError(f"dynmo.pipelining: model.{blocks} holds no blocks")
        for name in (*first, *last):
            if not isinstance(getattr(model, name, None), nn.Module):
                raise TypeError(f"dynmo.pipelining: model.{name} must be an nn.Module "
                                f"(first={list(first)}, last={list(last)})")
        self.blocks = blocks
        self.first = tuple(first)
        self.last = tuple(last)
        self.block_keys: List[str] = list(holder.keys())
        self.num_layers = len(self.block_keys) + 2

    @property
    def num_blocks(self) -> int:
        return len(self.block_keys)

    def fqns(self, layer: int) -> List[str]:
        """The FQNs of ``layer``'s modules in the model."""
        self.check_layer(layer)
        if layer == 0:
            return list(self.first)
        if layer == self.num_layers - 1:
            return list(self.last)
        return [f"{self.blocks}.{self.block_keys[layer - 1]}"]

    def check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"dynmo.pipelining: layer {layer} outside the model's "
                             f"[0, {self.num_layers})")

    def check_boundaries(self, boundaries: Sequence[int], stages: int) -> List[int]:
        b = [int(x) for x in boundaries]
        if (len(b) != stages + 1 or b[0] != 0 or b[-1] != self.num_layers
                or any(x >= y for x, y in zip(b, b[1:]))):
            raise ValueError(
                f"dynmo.pipelining: boundaries {','.join(map(str, b))} must be {stages + 1} "
                f"increasing integers from 0 to {self.num_layers} (one non-empty range "
                f"per stage)")
        return b


def _get(model: nn.Module, fqn: str) -> nn.Module:
    return model.get_submodule(fqn)


class ModelParts:
    """The layers one rank holds, the skeleton of all and the shell."""

    def __init__(self, model: nn.Module, layout: ModelLayout, held: Iterable[int],
                 device: torch.device) -> None:
        self.layout = layout
        self.device = device
        held = set(held)
        self.skeleton: Dict[int, List[nn.Module]] = {}
        self.held: Dict[int, List[nn.Module]] = {}
        for layer in range(layout.num_layers):
            modules = [_get(model, f) for f in layout.fqns(layer)]
            if layer in held:
                self.skeleton[layer] = [copy.deepcopy(m).to("meta") for m in modules]
                self.held[layer] = [m.to(device) for m in modules]
            else:
                self.skeleton[layer] = [m.to("meta") for m in modules]
        # The shell: the model without what the layers hold.
        setattr(model, layout.blocks, nn.ModuleDict())
        for name in (*layout.first, *layout.last):
            setattr(model, name, None)
        stray = [n for n, _ in model.named_parameters()]
        if stray:
            raise ValueError(f"dynmo.pipelining: parameters outside the layers "
                             f"({', '.join(stray[:4])}) would be replicated on every stage")
        self.shell = model.to(device)

    def empty_layer(self, layer: int) -> List[nn.Module]:
        """A layer of the same architecture with uninitialised tensors on the
        device (to receive a migrated layer into)."""
        self.layout.check_layer(layer)
        return [copy.deepcopy(m).to_empty(device=self.device) for m in self.skeleton[layer]]

    def chunk(self, first: int, end: int) -> nn.Module:
        """The module of a stage holding layers [first, end) (all held here)."""
        missing = [i for i in range(first, end) if i not in self.held]
        if missing:
            raise RuntimeError(f"dynmo.pipelining: this rank lacks layers {missing} of "
                               f"[{first}, {end})")
        lay = self.layout
        chunk = copy.deepcopy(self.shell)
        setattr(chunk, lay.blocks, nn.ModuleDict(
            {lay.block_keys[i - 1]: self.held[i][0]
             for i in range(max(first, 1), min(end, lay.num_layers - 1))}))
        if first == 0:
            for name, m in zip(lay.first, self.held[0]):
                setattr(chunk, name, m)
        if end == lay.num_layers:
            for name, m in zip(lay.last, self.held[lay.num_layers - 1]):
                setattr(chunk, name, m)
        return chunk

    def parameters(self) -> List[nn.Parameter]:
        """The held layers' parameters in layer order."""
        return [p for layer in sorted(self.held) for m in self.held[layer]
                for p in m.parameters()]
