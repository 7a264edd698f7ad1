"""A pipeline split as torchtitan, Megatron-LM and DeepSpeed take it, to and
from DynMo's boundaries: carry the split DynMo chose into a job that never
runs DynMo, or hand DynMo the split a job runs now.

The layer model is torchtitan's Llama layout. Of L = blocks + 2 pipeline
layers, layer 0 is ``tok_embeddings``, layer k (1..L-2) is ``layers.<k-1>``
and layer L-1 is ``norm`` with ``output``; boundaries ``b`` give stage s the
layers ``[b[s], b[s+1])``, which is DeepSpeed's ``parts``. Stages are listed
in model order, virtual stages included. ::

    >>> to_torchtitan([0, 3, 6])
    [['tok_embeddings', 'layers.0', 'layers.1'], ['layers.2', 'layers.3', 'norm', 'output']]
    >>> to_megatron([0, 4, 7, 10])
    'Et*3|t*3|t*2,L'
    >>> from_megatron("Et*3|(tt|)*2,t|L")
    [0, 4, 6, 8, 9, 10]

This is the C++ codec behind ``dynmo-plan --current`` and ``--layout-format``
(formats/plan_formats.h), so a split with no boundaries (an
unknown module, a layer in no stage or in two, a stage that is empty or not
contiguous, a malformed layout, Megatron MTP layers) raises
``InvalidArgumentError``, a ValueError, with dynmo-plan's one-line message.
Give ``num_layers`` and ``num_stages`` to check a split against the model;
otherwise they are inferred from the split.
"""
from __future__ import annotations

import json
import operator
from typing import Any, List, Optional, Sequence

from dynmo import _core

__all__ = [
    "from_deepspeed", "from_megatron", "from_torchtitan",
    "to_deepspeed", "to_megatron", "to_torchtitan",
]


def to_torchtitan(boundaries: Sequence[int]) -> List[List[str]]:
    """Returns torchtitan's ``module_fqns_per_model_part`` for ``boundaries``."""
    return _write("torchtitan", boundaries)


def from_torchtitan(module_fqns_per_model_part: Sequence[Sequence[str]], *,
                    num_layers: Optional[int] = None,
                    num_stages: Optional[int] = None) -> List[int]:
    """Returns the boundaries of torchtitan's ``module_fqns_per_model_part``
    (the order of FQNs within a model part does not matter)."""
    return _read("torchtitan", [list(part) for part in module_fqns_per_model_part],
                 num_layers, num_stages)


def to_megatron(boundaries: Sequence[int]) -> str:
    """Returns Megatron-LM's ``--pipeline-model-parallel-layout`` string."""
    return _write("megatron", boundaries)


def from_megatron(layout: str, *, num_layers: Optional[int] = None,
                  num_stages: Optional[int] = None) -> List[int]:
    """Returns the boundaries of a Megatron-LM layout string ("Et*3|t*3|t*2,L")."""
    return _read("megatron", layout, num_layers, num_stages)


def to_deepspeed(boundaries: Sequence[int]) -> List[int]:
    """Returns DeepSpeed's ``PipelineModule.parts``: the boundaries, checked."""
    return _write("deepspeed", boundaries)


def from_deepspeed(parts: Sequence[int], *, num_layers: Optional[int] = None,
                   num_stages: Optional[int] = None) -> List[int]:
    """Returns the boundaries of DeepSpeed's ``parts``, checked."""
    return _read("deepspeed", list(parts), num_layers, num_stages)


def _write(format: str, boundaries: Sequence[int]) -> Any:
    # operator.index refuses 1.5 where int() would quietly make it 1.
    return json.loads(_core.split_write(format, [operator.index(b) for b in boundaries]))


def _read(format: str, value: Any, num_layers: Optional[int],
          num_stages: Optional[int]) -> List[int]:
    return _core.split_read(format, json.dumps(value),
                            -1 if num_layers is None else num_layers,
                            -1 if num_stages is None else num_stages)
