"""A small Llama-style decoder in torchtitan's layout (RMSNorm, RoPE,
SwiGLU, grouped-query attention), with two dynamic cases that change what a
layer costs while training runs.

The layout is torchtitan's Llama 3: ``tok_embeddings``, the blocks in an
``nn.ModuleDict`` ``layers`` keyed "0".."N-1", ``norm`` and ``output``; the
``forward`` skips whichever of them is ``None``, so a stage holding only some
blocks is this same class (torchtitan splits its models that way, and so
does ``dynmo.pipelining``). RoPE's cos/sin tables are buffers of the model,
not of a block.

Dynamic cases (``set_dynamism`` per block, by layer id and iteration):
- freezing: a frozen block's weights stop training (``requires_grad``
  false): its backward computes only the input gradient, about half the
  work; freezing goes front to back (the paper's §2.2), the embedding stays
  trainable so gradients still flow to it.
- early exit: a block past the exit depth runs on the first ``keep`` of the
  sequence positions only; the others leave the network there and ride the
  residual stream unchanged (a deterministic stand-in for confidence-based
  exit: which tokens leave is fixed, how many leave grows with depth), so
  deep layers cost less.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass
class LlamaConfig:
    vocab: int = 256
    dim: int = 128
    n_layers: int = 8
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn_hidden: int = 352
    seq_len: int = 64
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(head_dim: int, seq_len: int, theta: float):
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(seq_len).float(), freqs)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """x: (batch, seq, heads, head_dim); rotates pairs (even, odd)."""
    t = x.shape[1]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    c, s = cos[:t, None, :], sin[:t, None, :]
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv = c.n_heads, c.n_kv_heads
        self.head_dim = c.dim // c.n_heads
        self.wq = nn.Linear(c.dim, c.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(c.dim, c.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(c.dim, c.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(c.n_heads * self.head_dim, c.dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim)
        k = self.wk(x).view(b, t, self.n_kv, self.head_dim)
        v = self.wv(x).view(b, t, self.n_kv, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        repeat = self.n_heads // self.n_kv  # grouped-query attention
        k = k.repeat_interleave(repeat, dim=2)
        v = v.repeat_interleave(repeat, dim=2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        out = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(c.dim, c.ffn_hidden, bias=False)
        self.w2 = nn.Linear(c.ffn_hidden, c.dim, bias=False)
        self.w3 = nn.Linear(c.dim, c.ffn_hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # SwiGLU


class TransformerBlock(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.attention = Attention(c)
        self.feed_forward = FeedForward(c)
        self.attention_norm = RMSNorm(c.dim, c.norm_eps)
        self.ffn_norm = RMSNorm(c.dim, c.norm_eps)
        self.keep = 1.0  # early exit: the share of positions this block runs on

    def forward(self, x, cos, sin):
        if self.keep < 1.0:
            n = max(1, math.ceil(x.shape[1] * self.keep))
            return torch.cat((self._run(x[:, :n], cos, sin), x[:, n:]), dim=1)
        return self._run(x, cos, sin)

    def _run(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.config = c
        self.tok_embeddings = nn.Embedding(c.vocab, c.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(c) for i in range(c.n_layers)})
        self.norm = RMSNorm(c.dim, c.norm_eps)
        self.output = nn.Linear(c.dim, c.vocab, bias=False)
        cos, sin = rope_tables(c.dim // c.n_heads, c.seq_len, c.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, self.rope_cos, self.rope_sin)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


def set_dynamism(kind: str, layer: int, modules, iteration: int, steps: int,
                 n_layers: int) -> None:
    """Applies the dynamic case's state at ``iteration`` to pipeline layer
    ``layer`` (1..n_layers are blocks). Deterministic: a function of the
    layer id and the iteration only, so every placement trains alike."""
    if not 1 <= layer <= n_layers:
        return
    block = modules[0]
    depth = layer - 1
    progress = iteration / max(steps, 1)
    if kind in ("freezing", "both"):
        # From 20% of the run on, the front blocks freeze one by one, up to
        # 3/4 of them by 70%.
        frozen = int(min(max(progress - 0.2, 0.0) / 0.5, 1.0) * (n_layers * 3 // 4))
        for p in block.parameters():
            p.requires_grad_(depth >= frozen)
    if kind in ("early-exit", "both"):
        # From 20% on, blocks in the back half run on fewer positions: the
        # last block on a quarter of them.
        if progress >= 0.2 and depth >= n_layers // 2:
            back = (depth - n_layers // 2 + 1) / (n_layers - n_layers // 2)
            block.keep = 1.0 - 0.75 * back
        else:
            block.keep = 1.0


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
