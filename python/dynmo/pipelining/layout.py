"""How a model maps onto DynMo's pipeline layers.

A model has blocks in a container (``layers`` in torchtitan,
``model.layers`` in a transformers causal LM; an ``nn.ModuleDict`` keyed by
layer id or an ``nn.ModuleList``) and modules before and after them that
only the first and the last stage hold (the token embedding; the final
norm and the output head). Which model is which, and how a stage's chunk of
it runs, is its family (``families.py``): torchtitan's layout and the
transformers causal LMs are recognised, other models are named with
``blocks``/``first``/``last`` (dotted paths).

DynMo numbers the pipeline layers 0 .. N+1: layer 0 is the ``first`` modules
(the token embedding), layers 1..N the blocks in their container's order,
layer N+1 the ``last`` modules (final norm, head). A stage holds a
contiguous range ``[b[s], b[s+1])`` of them (core's boundaries).

``ModelLayout`` checks a model's form and names each layer's modules (their
FQNs, which stay the model's own so checkpoints keep their keys); every
check runs before anything is built. ``ModelParts`` takes the model apart:
the live modules this rank holds, a meta-device skeleton of every layer (to
build an empty layer that receives a migrated one) and the shell (a copy of
the model without its layers: its ``forward``, config and shared buffers
such as RoPE tables), from which ``chunk`` builds the ``nn.Module`` a
``PipelineStage`` wraps. It leaves the user's model whole until
``take_apart`` (``restore`` moves the held layers back to the devices they
came from, for a constructor that fails). Not thread-safe: the training thread.
"""
from __future__ import annotations

import copy
import itertools
from typing import Dict, Iterable, List, Optional, Sequence

import torch
from torch import nn

from dynmo.pipelining.families import ChunkPieces, Family, family_of


class ModelLayout:
    """The layer ids of a model and their modules' FQNs. ``blocks``,
    ``first``, ``last``: the pieces' dotted names; any not given are those
    of the layout recognised (``families.family_of``)."""

    def __init__(self, model: nn.Module, blocks: Optional[str] = None,
                 first: Optional[Sequence[str]] = None,
                 last: Optional[Sequence[str]] = None) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"dynmo.pipelining: the model must be an nn.Module, "
                            f"got {type(model).__name__}")
        self.family: Family = family_of(model, blocks, first, last)
        self.blocks = self.family.blocks
        self.first = self.family.first
        self.last = self.family.last
        holder = model.get_submodule(self.blocks)
        self.blocks_are_list = isinstance(holder, nn.ModuleList)
        self.block_keys: List[str] = [str(k) for k in (
            range(len(holder)) if self.blocks_are_list else holder.keys())]
        self.num_layers = len(self.block_keys) + 2
        layers = [f for layer in range(self.num_layers) for f in self.fqns(layer)]
        stray = [n for n, _ in model.named_parameters()
                 if not any(n.startswith(f + ".") for f in layers)]
        if stray:
            raise ValueError(f"dynmo.pipelining: parameters outside the layers "
                             f"({', '.join(stray[:4])}) would be replicated on every stage")

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


class HeldBlocks(nn.ModuleDict):
    """The blocks of a chunk whose model keeps them in an ``nn.ModuleList``:
    under their indices in the model (so their state-dict keys stay the
    model's), iterated as a list is (``for block in self.layers``)."""

    def __iter__(self):
        return iter(self._modules.values())


class ModelParts:
    """The layers one rank holds, the skeleton of all and the shell."""

    def __init__(self, model: nn.Module, layout: ModelLayout, held: Iterable[int],
                 device: torch.device) -> None:
        self.layout = layout
        self.device = device
        held = set(held)
        self.skeleton: Dict[int, List[nn.Module]] = {}
        self.held: Dict[int, List[nn.Module]] = {}
        self._came_from: Dict[int, List[Optional[torch.device]]] = {}
        # The user's modules of a layer held as copies (replace_held), for restore.
        self._originals: Dict[int, List[nn.Module]] = {}
        for layer in range(layout.num_layers):
            modules = [model.get_submodule(f) for f in layout.fqns(layer)]
            self.skeleton[layer] = [_meta_copy(m) for m in modules]
            if layer in held:
                self._came_from[layer] = [_device_of(m) for m in modules]
                self.held[layer] = [m.to(device) for m in modules]
        # The shell: a copy of the model without what the layers hold.
        pieces = [model.get_submodule(f) for f in (*layout.first, *layout.last)]
        blocks = model.get_submodule(layout.blocks)
        memo = {id(m): None for m in pieces}
        memo[id(blocks)] = nn.ModuleDict()
        self.shell = copy.deepcopy(model, memo).to(device)

    def replace_held(self, layer: int, modules: Sequence[nn.Module]) -> None:
        """Holds ``modules`` (copies made from the user's, such as FSDP2's
        sharded units) for ``layer`` in place of the user's own, which
        ``restore`` still returns whole until ``take_apart``."""
        self._originals.setdefault(layer, self.held[layer])
        self.held[layer] = list(modules)

    def restore(self) -> None:
        """Moves the user's held layers back to the devices they came from
        (the user's model as it was, when the pipeline is not built)."""
        for layer, devices in self._came_from.items():
            own = self._originals.get(layer, self.held.get(layer, ()))
            for module, device in zip(own, devices):
                if device is not None:
                    module.to(device)

    def take_apart(self, model: nn.Module) -> None:
        """Empties the user's ``model`` of its layers (the held ones live on
        in the stages; the others are freed): once the pipeline is built."""
        lay = self.layout
        self._originals.clear()
        for fqn in (*lay.first, *lay.last):
            _set(model, fqn, None)
        _set(model, lay.blocks, type(model.get_submodule(lay.blocks))())

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
        ids = range(max(first, 1), min(end, lay.num_layers - 1))
        container = HeldBlocks if lay.blocks_are_list and lay.family.own_forward else \
            nn.ModuleDict
        _set(chunk, lay.blocks, container({lay.block_keys[i - 1]: self.held[i][0] for i in ids}))
        head = self.held[0] if first == 0 else []
        tail = self.held[lay.num_layers - 1] if end == lay.num_layers else []
        for name, m in zip(lay.first, head):
            _set(chunk, name, m)
        for name, m in zip(lay.last, tail):
            _set(chunk, name, m)
        if lay.family.own_forward:
            return chunk
        return AdaptedChunk(chunk, lay.family, ChunkPieces(
            chunk, list(head), [(i - 1, self.held[i][0]) for i in ids], list(tail)))

    def parameters(self) -> List[nn.Parameter]:
        """The held layers' parameters in layer order."""
        return [p for layer in sorted(self.held) for m in self.held[layer]
                for p in m.parameters()]


class AdaptedChunk(nn.Module):
    """A stage's chunk of a model whose own forward cannot run part of it
    (a transformers causal LM): the shell's modules with the chunk's layers
    in them, under the model's own names (so its state-dict keys are the
    model's), run by the family (``Family.run``)."""

    def __init__(self, shell: nn.Module, family: Family, pieces: ChunkPieces) -> None:
        super().__init__()
        for name, child in shell.named_children():
            self.add_module(name, child)
        for name, buf in shell.named_buffers(recurse=False):
            self.register_buffer(name, buf,
                                 persistent=name not in shell._non_persistent_buffers_set)
        pieces.root = self
        self._family = family
        self._pieces = pieces

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._family.run(self._pieces, x)


def _meta_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose parameters and buffers are on the meta
    device (its structure without its data: nothing is copied)."""
    memo = {}
    for t in itertools.chain(module.parameters(), module.buffers()):
        meta = torch.empty_like(t, device="meta")
        memo[id(t)] = nn.Parameter(meta, requires_grad=t.requires_grad) \
            if isinstance(t, nn.Parameter) else meta
    return copy.deepcopy(module, memo)


def _device_of(module: nn.Module) -> Optional[torch.device]:
    """The device of ``module``'s first tensor (None without one)."""
    tensor = next(itertools.chain(module.parameters(), module.buffers()), None)
    return tensor.device if tensor is not None else None


def _set(root: nn.Module, fqn: str, value: Optional[nn.Module]) -> None:
    parent, _, name = fqn.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, value)
