"""The example's data: micro-batches of byte tokens cut from a fixed text.

Micro-batch m of iteration k is the same on every rank and in every run
(offsets from a generator seeded by (seed, k, m)), whatever the placement.
"""
from __future__ import annotations

from typing import Tuple

import torch

_TEXT = (
    "DynMo keeps pipeline-parallel training of dynamic models balanced: it "
    "measures every layer, decides a new contiguous layer-to-stage plan, and "
    "moves layers with their optimizer state while training goes on. "
    "Mixture of Experts, pruning, freezing, sparse attention, early exit and "
    "Mixture of Depths all change what a layer costs as training runs. "
) * 8


def corpus() -> torch.Tensor:
    return torch.tensor(list(_TEXT.encode()), dtype=torch.int64)


def micro_batch(data: torch.Tensor, seed: int, iteration: int, m: int, rows: int,
                seq_len: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(tokens, targets), each [rows, seq_len]."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + iteration) * 1009 + m)
    starts = torch.randint(0, data.numel() - seq_len - 1, (rows,), generator=g)
    tokens = torch.stack([data[s:s + seq_len] for s in starts.tolist()])
    targets = torch.stack([data[s + 1:s + seq_len + 1] for s in starts.tolist()])
    return tokens, targets
