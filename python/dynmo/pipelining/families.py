"""The model families ``DynamicPipeline`` takes as they are, and how a
stage's chunk of each runs.

A family names a model's pieces — the container of its blocks
(``layers``, ``model.layers``: an ``nn.ModuleDict`` or ``nn.ModuleList``),
the modules before the blocks that pipeline layer 0 holds (the token
embedding) and the modules after them that the last layer holds (final
norm, output head) — and says how a chunk holding layers [a, b) runs:

- ``OwnForward``: the model's own ``forward`` skips whichever piece is
  ``None``, as torchtitan's models do (0.2.x's head is ``output``, 0.3.x's
  ``lm_head``); so does any model whose pieces the user names. The chunk is
  the model with only its layers left in it.
- ``HuggingFaceCausalLM``: a ``transformers`` causal LM of the Llama,
  Qwen2/Qwen3, Mistral or Gemma families (``model.embed_tokens``,
  ``model.layers``, ``model.norm``, ``lm_head``, ``model.rotary_emb``).
  Its forward cannot run part of the model (it always embeds and slices
  its layers), so the chunk runs what that forward runs between the pieces
  it holds: the embedding (times sqrt(hidden) for a Gemma whose embedding
  does not scale itself); for its blocks the positions, rotary embeddings
  and causal masks the model's forward computes, made inside the chunk
  from the hidden states' shape (so only hidden states travel between
  stages, as ``torch.distributed.pipelining`` requires) and passed by
  keyword as the model passes them; the final norm and head (and Gemma
  2/3's logit soft-cap). Attention is causal over the whole sequence:
  padding masks and KV caches are not carried.

``family_of(model, blocks, first, last)`` finds the family: the names the
user gives, else the layout it recognises. A model it cannot take is
refused with one line naming the attribute it looked for and what it found.
Stateless after construction; not thread-safe: the training thread.
"""
from __future__ import annotations

import inspect
import sys
from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn

# The transformers model types whose decoder layers and forward
# HuggingFaceCausalLM reproduces (their modeling_*.py read for it).
HF_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text")


class Family:
    """A model's pieces by dotted name; ``run`` is the chunk's forward when
    the model's own cannot be used (``own_forward`` False)."""

    name = "model"
    own_forward = True

    def __init__(self, blocks: str, first: Sequence[str], last: Sequence[str]) -> None:
        self.blocks = blocks
        self.first = tuple(first)
        self.last = tuple(last)

    def run(self, chunk: "ChunkPieces", x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class OwnForward(Family):
    """torchtitan's layout, or any model named by the user: the model's
    forward runs the chunk, skipping the pieces that are ``None``."""

    def __init__(self, name: str, blocks: str, first: Sequence[str],
                 last: Sequence[str]) -> None:
        super().__init__(blocks, first, last)
        self.name = name


class ChunkPieces:
    """What ``HuggingFaceCausalLM.run`` reads of a chunk: its modules before
    the blocks, its blocks by index in the model, its modules after them,
    and the chunk itself (for the model's shared modules: rotary
    embeddings)."""

    def __init__(self, root: nn.Module, first: List[nn.Module],
                 blocks: List[Tuple[int, nn.Module]], last: List[nn.Module]) -> None:
        self.root, self.first, self.blocks, self.last = root, first, blocks, last


class HuggingFaceCausalLM(Family):
    """A transformers ``*ForCausalLM`` of ``HF_MODEL_TYPES``, run piecewise."""

    own_forward = False

    def __init__(self, model: nn.Module, blocks: str = "model.layers",
                 first: Sequence[str] = ("model.embed_tokens",),
                 last: Sequence[str] = ("model.norm", "lm_head"),
                 rotary: str = "model.rotary_emb") -> None:
        super().__init__(blocks, first, last)
        config = model.config
        self.name = f"transformers {type(model).__name__}"
        self.rotary = rotary
        n = len(_resolve(model, blocks)[0])
        # Which mask each block takes: the model's forward gives layer i the
        # mask of config.layer_types[i] (Qwen2/3, Gemma 2/3), Mistral's
        # sliding-window mask when it has a window, else the causal one.
        types = getattr(config, "layer_types", None)
        if types is None:
            window = getattr(config, "sliding_window", None) is not None
            types = ["sliding_attention" if window else "full_attention"] * n
        self.layer_types = list(types)
        modeling = sys.modules[type(_resolve(model, blocks)[0][0]).__module__]
        makers = {"full_attention": "create_causal_mask",
                  "sliding_attention": "create_sliding_window_causal_mask"}
        self._masks = {t: getattr(modeling, makers.get(t, ""), None) for t in set(types)}
        lacking = sorted(t for t, make in self._masks.items() if make is None)
        if lacking:
            raise TypeError(f"dynmo.pipelining: cannot take transformers {type(model).__name__}: "
                            f"looked for the mask function of its {', '.join(lacking)} layers "
                            f"in {modeling.__name__}, found none")
        # Gemma scales its embeddings by sqrt(hidden): transformers 5 in the
        # embedding module (embed_scale), earlier releases in the forward.
        embed = _resolve(model, first[0])[0]
        self.embed_scale: Optional[float] = (
            config.hidden_size ** 0.5
            if config.model_type.startswith("gemma") and not hasattr(embed, "embed_scale")
            else None)
        self.softcap = getattr(config, "final_logit_softcapping", None)
        rope = _resolve(model, rotary)[0]
        self._rope_per_type = "layer_type" in inspect.signature(rope.forward).parameters
        self._mask_config = config
        self._mask_takes = {name for make in self._masks.values()
                            for name in inspect.signature(make).parameters}

    def run(self, chunk: ChunkPieces, x: torch.Tensor) -> torch.Tensor:
        h = x
        for m in chunk.first:
            h = m(h)
        if chunk.first and self.embed_scale is not None:
            h = h * torch.tensor(self.embed_scale, dtype=h.dtype)
        if chunk.blocks:
            positions = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
            kinds = sorted({self.layer_types[i] for i, _ in chunk.blocks})
            masks = {k: self._mask(k, h, positions) for k in kinds}
            rope = chunk.root.get_submodule(self.rotary)
            if self._rope_per_type:
                cos_sin = {k: rope(h, positions, k) for k in kinds}
            else:
                shared = rope(h, positions)
                cos_sin = {k: shared for k in kinds}
            for i, block in chunk.blocks:
                kind = self.layer_types[i]
                out = block(h, attention_mask=masks[kind], position_embeddings=cos_sin[kind],
                            position_ids=positions)
                h = out[0] if isinstance(out, tuple) else out  # transformers 4 returns a tuple
        for m in chunk.last:
            h = m(h)
        if chunk.last and self.softcap is not None:
            h = torch.tanh(h / self.softcap) * self.softcap
        return h

    def _mask(self, kind: str, h: torch.Tensor, positions: torch.Tensor):
        """The mask the model's forward would give a ``kind`` layer for a
        whole, unpadded sequence of ``h``'s length: None (sdpa's causal
        path) or a causal additive mask (eager)."""
        given = {"config": self._mask_config, "inputs_embeds": h, "attention_mask": None,
                 "cache": None, "past_key_values": None,
                 # transformers 4's cache_position; positions are not passed
                 # (a fresh sequence: packed-sequence detection would read
                 # them back on the host, and finds nothing).
                 "cache_position": positions[0]}
        return self._masks[kind](**{k: v for k, v in given.items() if k in self._mask_takes})


def family_of(model: nn.Module, blocks: Optional[str] = None,
              first: Optional[Sequence[str]] = None,
              last: Optional[Sequence[str]] = None) -> Family:
    """The family of ``model``: the pieces the user names (any not given are
    the recognised layout's, else torchtitan's names), else the layout
    recognised. TypeError, one line, when it cannot take the model."""
    if blocks is None and first is None and last is None:
        return _recognise(model)
    try:
        found: Optional[Family] = _recognise(model)
    except TypeError:
        if _is_transformers(model):
            raise
        found = None
    blocks = blocks if blocks is not None else (found.blocks if found else "layers")
    first = tuple(first) if first is not None else (found.first if found else
                                                    ("tok_embeddings",))
    last = tuple(last) if last is not None else (found.last if found else ("norm", "output"))
    problem = _blocks_problem(model, blocks)
    if problem:
        raise TypeError(f"dynmo.pipelining: blocks={blocks!r}: looked for {problem}")
    if not first or not last:
        raise TypeError(f"dynmo.pipelining: first and last must each name at least one module "
                        f"(first={list(first)}, last={list(last)})")
    for fqn in (*first, *last):
        module, where = _resolve(model, fqn)
        if not isinstance(module, nn.Module):
            raise TypeError(f"dynmo.pipelining: model.{fqn} must be an nn.Module, found "
                            f"{where} (first={list(first)}, last={list(last)})")
    if isinstance(found, HuggingFaceCausalLM):
        return HuggingFaceCausalLM(model, blocks, first, last, found.rotary)
    return OwnForward(found.name if found else "model", blocks, first, last)


# ---- recognition -------------------------------------------------------------

def _recognise(model: nn.Module) -> Family:
    """torchtitan's layout or a transformers causal LM; else TypeError
    naming, of the layout the model comes closest to, the attribute looked
    for and what was there."""
    candidates = [_torchtitan(model), _transformers(model)]
    for family, _, _ in candidates:
        if family is not None:
            return family
    name = type(model).__name__
    if _is_transformers(model):
        raise TypeError(f"dynmo.pipelining: cannot take transformers {name}: "
                        f"{candidates[1][2]}")
    # The layout the model matched furthest; torchtitan's on a tie.
    _, _, problem = max(candidates, key=lambda c: c[1])
    raise TypeError(f"dynmo.pipelining: cannot take {name} as it is: {problem}; name its "
                    f"pieces with blocks=, first=, last=")


def _torchtitan(model: nn.Module):
    """(family or None, checks passed, what failed) for torchtitan's layout."""
    problem = _blocks_problem(model, "layers")
    if problem:
        return None, 0, f"looked for torchtitan's {problem}"
    for passed, name in enumerate(("tok_embeddings", "norm"), start=1):
        module, where = _resolve(model, name)
        if not isinstance(module, nn.Module):
            return None, passed, f"looked for torchtitan's model.{name}, found {where}"
    head = next((h for h in ("output", "lm_head")
                 if isinstance(_resolve(model, h)[0], nn.Module)), None)
    if head is None:
        return None, 3, (f"looked for torchtitan's head model.output (0.2) or model.lm_head "
                         f"(0.3), found {_resolve(model, 'output')[1]}")
    return OwnForward("torchtitan", "layers", ("tok_embeddings",), ("norm", head)), 4, ""


def _transformers(model: nn.Module):
    """(family or None, checks passed, what failed) for a transformers
    causal LM."""
    if _is_transformers(model) and isinstance(_resolve(model, "embed_tokens")[0], nn.Module):
        # The base model (LlamaModel): no head, and its output is not logits.
        return None, 5, (f"looked for a transformers causal LM's lm_head, found the base model "
                         f"{type(model).__name__} (pass its *ForCausalLM)")
    checks = (("model.layers", nn.ModuleList), ("model.embed_tokens", nn.Module),
              ("model.norm", nn.Module), ("lm_head", nn.Module),
              ("model.rotary_emb", nn.Module))
    for passed, (fqn, kind) in enumerate(checks):
        module, where = _resolve(model, fqn)
        if not isinstance(module, kind):
            return None, passed, (f"looked for a transformers causal LM's model.{fqn} "
                                  f"(an {_kind_name(kind)}), found {where}")
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if not _is_transformers(model) or model_type not in HF_MODEL_TYPES:
        return None, len(checks), (f"looked for config.model_type of a transformers causal LM "
                                   f"DynMo runs ({', '.join(HF_MODEL_TYPES)}), found "
                                   f"{model_type!r}")
    if getattr(config, "use_bidirectional_attention", False) or \
            not getattr(config, "is_causal", True):
        return None, len(checks), ("looked for causal attention (config.is_causal), found "
                                   "bidirectional attention")
    if len(model.model.layers) == 0:
        return None, len(checks), "looked for decoder layers in model.model.layers, found none"
    return HuggingFaceCausalLM(model), len(checks) + 1, ""


def _is_transformers(model: nn.Module) -> bool:
    return type(model).__module__.startswith("transformers.")


def _blocks_problem(model: nn.Module, blocks: str) -> str:
    """Why ``model.<blocks>`` cannot hold the blocks ("" when it can)."""
    holder, where = _resolve(model, blocks)
    if not isinstance(holder, (nn.ModuleDict, nn.ModuleList)):
        return (f"model.{blocks} (an nn.ModuleDict keyed by layer id or an nn.ModuleList of "
                f"the blocks), found {where}")
    if len(holder) == 0:
        return f"model.{blocks} with blocks in it, found it empty"
    return ""


def _resolve(model: nn.Module, fqn: str):
    """(the object at dotted ``fqn`` or None, a description of what was
    found: the object's type, or the first name that is missing)."""
    obj = model
    path = "model"
    for name in fqn.split("."):
        if isinstance(obj, nn.Module) and name in obj._modules:
            obj = obj._modules[name]
        elif hasattr(obj, name):
            obj = getattr(obj, name)
        else:
            return None, f"no attribute {path}.{name}"
        path = f"{path}.{name}"
    return obj, _describe(obj)


def _describe(obj) -> str:
    if obj is None:
        return "None"
    return f"a {type(obj).__name__}"


def _kind_name(kind) -> str:
    return "nn.ModuleList" if kind is nn.ModuleList else "nn.Module"
