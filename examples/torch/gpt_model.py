"""The example's GPT, as pipeline layers with stable global ids.

Layer 0 is the token + position embedding, layers 1..blocks the decoder
blocks (pre-LayerNorm causal self-attention and MLP), layer blocks+1 the
final LayerNorm and the LM head. ``build_layer(config, layer)`` makes any
of them from (seed, layer id) alone, so every rank can build any layer and
the model's initial weights do not depend on where a layer lives.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass(frozen=True)
class GptConfig:
    vocab: int = 256  # bytes
    seq_len: int = 64
    hidden: int = 128
    heads: int = 4
    blocks: int = 8
    seed: int = 0

    @property
    def num_layers(self) -> int:
        return self.blocks + 2


class Embedding(nn.Module):
    def __init__(self, c: GptConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(c.vocab, c.hidden)
        self.positions = nn.Embedding(c.seq_len, c.hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        return self.tokens(tokens) + self.positions(pos)


class Block(nn.Module):
    def __init__(self, c: GptConfig) -> None:
        super().__init__()
        self.heads = c.heads
        self.ln1 = nn.LayerNorm(c.hidden)
        self.qkv = nn.Linear(c.hidden, 3 * c.hidden)
        self.proj = nn.Linear(c.hidden, c.hidden)
        self.ln2 = nn.LayerNorm(c.hidden)
        self.mlp = nn.Sequential(nn.Linear(c.hidden, 4 * c.hidden), nn.GELU(),
                                 nn.Linear(4 * c.hidden, c.hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        q, k, v = (y.view(b, t, self.heads, h // self.heads).transpose(1, 2) for y in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, h))
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    def __init__(self, c: GptConfig) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(c.hidden)
        self.out = nn.Linear(c.hidden, c.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


def build_layer(c: GptConfig, layer: int) -> nn.Module:
    """Pipeline layer ``layer``, initialised from (seed, layer) only."""
    if not 0 <= layer < c.num_layers:
        raise ValueError(f"layer {layer} outside [0, {c.num_layers})")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(c.seed * 100003 + layer)
        if layer == 0:
            return Embedding(c)
        if layer == c.num_layers - 1:
            return Head(c)
        return Block(c)
