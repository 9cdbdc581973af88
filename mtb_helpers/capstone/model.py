"""The capstone model on one process: a tiny decoder-only transformer (GPT) on characters.

    ids [s, b] -> token embedding E[ids] + sinusoidal position -> x [s, b, h]
    L blocks:   x = x + Wo(attention(ln1(x)))        causal, n heads of d = h/n
                x = x + fc2(gelu(fc1(ln2(x))))       fc1 [h -> f], fc2 [f -> h]
    head:       logits = ln_f(x) @ W_lm.T            [s, b, h] -> [s, b, V]
    loss:       mean cross-entropy of logits against the next character

Sequence first (``[s, b, h]``) as in Megatron-LM and the rest of the course. Positions are the
fixed sinusoids of Vaswani et al. (2017), a buffer rather than a parameter, so a context-parallel
rank only needs the rows of its own chunk of the sequence. Every parameter is drawn from one
seeded generator (``make_model``), so the single process and every parallel layout start from
the very same weights. Biases and LayerNorm affines get small random values too: with zeros, a
bug in how a bias is reduced would not show until it had been trained away from zero.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPTConfig", "TinyGPT", "Block", "Attention", "MLP", "Embedding", "Head",
           "make_model", "sinusoids"]


@dataclass(frozen=True)
class GPTConfig:
    """Sizes: vocabulary V, sequence s, width h, heads n, MLP width f, blocks L."""
    vocab: int = 32
    seq: int = 16
    hidden: int = 32
    heads: int = 4
    ffn: int = 64
    layers: int = 4

    def to_dict(self) -> dict:
        return asdict(self)


def sinusoids(seq: int, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    """``[s, h]``: ``sin(p / 10000^(2i/h))`` in even features, ``cos`` in odd ones."""
    pos = torch.arange(seq, dtype=torch.float64)[:, None]
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, hidden, 2, dtype=torch.float64) / hidden)
    out = torch.zeros(seq, hidden, dtype=torch.float64)
    out[:, 0::2], out[:, 1::2] = torch.sin(pos * freq), torch.cos(pos * freq)
    return out.to(dtype)


class Embedding(nn.Module):
    """``ids [s, b] -> E[ids] + P[:s] [s, b, h]``."""

    def __init__(self, cfg: GPTConfig, dtype: torch.dtype):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden, dtype=dtype)
        self.register_buffer("pos", sinusoids(cfg.seq, cfg.hidden, dtype), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tok(ids) + self.pos[:ids.shape[0], None, :]   # [s, b, h] + [s, 1, h]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d) + causal mask) v`` on ``[b, n, s, d]``."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])     # [b, n, s, d] @ [b, n, d, s] -> [b, n, s, s]
    s = scores.shape[-1]
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(dim=-1) @ v                             # [b, n, s, s] @ [b, n, s, d] -> [b, n, s, d]


class Attention(nn.Module):
    """Causal multi-head self-attention; head i is features ``i*d:(i+1)*d`` of Q, K and V."""

    def __init__(self, cfg: GPTConfig, dtype: torch.dtype):
        super().__init__()
        self.heads = cfg.heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(cfg.hidden, cfg.hidden, dtype=dtype)
                                              for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, b, h = x.shape

        def split(z):   # [s, b, h] -> [b, n, s, d]
            return z.reshape(s, b, self.heads, h // self.heads).permute(1, 2, 0, 3)

        ctx = causal_attention(split(self.wq(x)), split(self.wk(x)), split(self.wv(x)))
        return self.wo(ctx.permute(2, 0, 1, 3).reshape(s, b, h))  # [b, n, s, d] -> [s, b, h] -> Wo


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig, dtype: torch.dtype):
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden, cfg.ffn, dtype=dtype)
        self.fc2 = nn.Linear(cfg.ffn, cfg.hidden, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))   # [s, b, h] -> [s, b, f] -> [s, b, h]


class Block(nn.Module):
    """Pre-LayerNorm transformer block, ``[s, b, h] -> [s, b, h]``."""

    def __init__(self, cfg: GPTConfig, dtype: torch.dtype):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden, dtype=dtype)
        self.attn = Attention(cfg, dtype)
        self.ln2 = nn.LayerNorm(cfg.hidden, dtype=dtype)
        self.mlp = MLP(cfg, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    """``ln_f`` then the LM head (no bias): ``[s, b, h] -> [s, b, V]``."""

    def __init__(self, cfg: GPTConfig, dtype: torch.dtype):
        super().__init__()
        self.ln_f = nn.LayerNorm(cfg.hidden, dtype=dtype)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


class TinyGPT(nn.Module):
    """``embed``, ``blocks[0..L-1]``, ``head``; ``forward(ids [s, b]) -> logits [s, b, V]``."""

    def __init__(self, cfg: GPTConfig, dtype: torch.dtype = torch.float64):
        super().__init__()
        self.cfg = cfg
        self.embed = Embedding(cfg, dtype)
        self.blocks = nn.ModuleList(Block(cfg, dtype) for _ in range(cfg.layers))
        self.head = Head(cfg, dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def loss(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over all ``s * b`` positions."""
        logits = self(ids)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_model(cfg: GPTConfig = GPTConfig(), seed: int = 0,
               dtype: torch.dtype = torch.float64) -> TinyGPT:
    """The model with every parameter drawn from one generator seeded with ``seed``: weights
    ``N(0, 0.02^2)`` (GPT-2's scale), biases ``N(0, 0.02^2)``, LayerNorm weights ``1 + N(0, 0.02^2)``."""
    model = TinyGPT(cfg, dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = 0.02 * torch.randn(p.shape, generator=gen, dtype=torch.float64).to(dtype)
            p.copy_(1.0 + noise if ("ln" in name and name.endswith("weight")) else noise)
    return model
