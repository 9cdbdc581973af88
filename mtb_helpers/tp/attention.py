"""Tensor-parallel self-attention (Shoeybi et al. 2019, section 3): heads are the natural split.

Notation: ``x`` is ``[s, b, h]`` (sequence first, as in the sequence-parallel block), ``n`` heads of
``d = h/n`` features, ``t`` ranks. Head ``i`` is features ``i*d:(i+1)*d`` of Q, K and V, as in
``nn.MultiheadAttention``. Heads never talk to each other inside attention, so rank ``r`` can own
heads ``r*a/t .. (r+1)*a/t - 1`` entirely:

* Q, K, V are column-parallel: rank r holds the rows of ``Wq, Wk, Wv`` that produce its heads'
  features, ``h/t`` of each. The three shards are stacked into ONE ``ColumnParallelLinear``
  (``[3h/t, h]`` per rank, like Megatron's fused ``query_key_value``), so the input enters the
  tensor-parallel region through one ``f``: forward identity, backward one all-reduce of dX.
* each rank runs softmax attention on its own ``a/t`` heads: no communication.
* the output projection is row-parallel: rank r holds the ``h/t`` input columns of ``Wo`` that read
  its heads, produces a partial ``[s, b, h]`` and ``g`` all-reduces it; ``bo`` is added once, after.

One ``f`` and one ``g`` for the whole block, exactly like the MLP (notebook 03).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from mtb_helpers.comm.mesh import group_rank, group_size
from mtb_helpers.comm.sharding import Replicate, Shard
from mtb_helpers.tp.layers import ColumnParallelLinear, RowParallelLinear

__all__ = ["ParallelSelfAttention", "LocalAttention", "check_heads", "group_heads", "grouped_qkv"]


def check_heads(hidden: int, n_heads: int, world_size: int) -> int:
    """``d = hidden / n_heads``; ValueError naming the sizes unless heads divide evenly."""
    if n_heads < 1 or hidden % n_heads:
        raise ValueError(f"hidden={hidden} is not divisible by n_heads={n_heads}: every head "
                         f"needs the same number of features")
    if n_heads % world_size:
        raise ValueError(f"n_heads={n_heads} is not divisible by the world size {world_size}: "
                         f"tensor-parallel attention gives each rank n_heads/t whole heads")
    return hidden // n_heads


def group_heads(parts: list[torch.Tensor], world_size: int, dim: int) -> torch.Tensor:
    """``[Q, K, V]`` -> ``[Q_0, K_0, V_0, Q_1, K_1, V_1, ...]`` along ``dim``, where ``Q_r`` is
    rank r's ``1/t`` of Q (its heads): rank r's contiguous ``1/t`` of the result is its heads."""
    chunks = [p.chunk(world_size, dim=dim) for p in parts]
    return torch.cat([c[r] for r in range(world_size) for c in chunks], dim=dim)


def grouped_qkv(wq: nn.Linear, wk: nn.Linear, wv: nn.Linear, world_size: int) -> nn.Linear:
    """One ``nn.Linear(h, 3h)`` whose ``.weight`` rows are ``[Q_0, K_0, V_0, Q_1, K_1, V_1, ...]``
    (``Q_r``: the ``h/t`` rows of ``wq.weight`` for rank r's heads, put in order by ``group_heads``):
    a contiguous split of its rows (a column split of ``Wqkv``) gives rank r its ``.weight``
    ``[Q_r; K_r; V_r]``, ``[3h/t, h]``."""
    fused = nn.Linear(wq.in_features, 3 * wq.out_features, dtype=wq.weight.dtype)
    with torch.no_grad():
        fused.weight.copy_(group_heads([wq.weight, wk.weight, wv.weight], world_size, 0))
        fused.bias.copy_(group_heads([wq.bias, wk.bias, wv.bias], world_size, 0))
    return fused


class LocalAttention(nn.Module):
    """Softmax attention on this rank's ``a/t`` heads; no communication.

    forward: ``qkv [s, b, 3h/t]`` (this rank's ``[Q_r, K_r, V_r]`` features) -> ``[s, b, h/t]``.
    """
    # [s, b, 3h/t] in (columns of the head-grouped [Q_0 K_0 V_0 Q_1 ..]), [s, b, h/t] out
    input_layouts = output_layouts = Shard(-1)

    def __init__(self, n_heads: int, head_dim: int, causal: bool = True, world_size: int = 1):
        super().__init__()
        check_heads(n_heads * head_dim, n_heads, world_size)   # whole heads on every rank
        self.n_heads, self.head_dim, self.causal = n_heads, head_dim, causal
        self.world_size = world_size
        self.local_heads = n_heads // world_size

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``[s, b, h/t] -> [b, a/t, s, d]``: local feature ``j*d:(j+1)*d`` is local head ``j``."""
        s, b, width = x.shape
        if width != self.local_heads * self.head_dim:   # else reshape would cut other heads
            raise ValueError(f"qkv must be [s, b, 3 x {self.local_heads} heads x {self.head_dim}]"
                             f" = [s, b, {3 * self.local_heads * self.head_dim}] on this rank; its "
                             f"Q, K or V part has {width} features")
        return x.reshape(s, b, self.local_heads, -1).permute(1, 2, 0, 3)

    @staticmethod
    def merge_heads(x: torch.Tensor) -> torch.Tensor:
        """``[b, heads, s, d] -> [s, b, heads*d]``, the inverse of ``split_heads``."""
        b, heads, s, d = x.shape
        return x.permute(2, 0, 1, 3).reshape(s, b, heads * d)

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        q, k, v = (self.split_heads(z) for z in qkv.chunk(3, dim=-1))  # 3 x [b, a/t, s, d]
        scale = 1.0 / math.sqrt(q.shape[-1])
        scores = q @ k.transpose(-2, -1) * scale      # [b, a/t, s, d] @ [b, a/t, d, s] -> [b, a/t, s, s]
        if self.causal:
            s = scores.shape[-1]
            mask = torch.ones(s, s, dtype=torch.bool, device=scores.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        ctx = scores.softmax(dim=-1) @ v              # [b, a/t, s, s] @ [b, a/t, s, d] -> [b, a/t, s, d]
        return self.merge_heads(ctx)                  # -> [s, b, h/t]

    def extra_repr(self) -> str:
        return (f"heads {self.local_heads} of {self.n_heads}, head_dim={self.head_dim}, "
                f"causal={self.causal}")


class ParallelSelfAttention(nn.Module):
    """``y = Wo(attention(Wq x, Wk x, Wv x)) + bo`` with heads split over the group.

    forward: ``x [s, b, h]`` (replicated) -> ``[s, b, h]`` (replicated, after one all-reduce).
    ``.qkv`` is a ``ColumnParallelLinear`` with ``.weight [3h/t, h]`` (rows ``[Q_r; K_r; V_r]``),
    ``.out`` a ``RowParallelLinear`` with ``.weight [h, h/t]`` and the full bias.
    """
    input_layouts = output_layouts = Replicate()   # [s, b, h] both

    def __init__(self, qkv: ColumnParallelLinear, core: LocalAttention, out: RowParallelLinear):
        super().__init__()
        if qkv.gather_output or not out.input_is_parallel:
            raise ValueError("ParallelSelfAttention keeps the heads on their ranks: qkv needs "
                             "gather_output=False and out input_is_parallel=True")
        if core.world_size != group_size(qkv.group):
            raise ValueError(f"core splits the heads over {core.world_size} ranks but qkv's group "
                             f"has {group_size(qkv.group)}")
        self.qkv, self.core, self.out = qkv, core, out

    @classmethod
    def from_full(cls, wq: nn.Linear, wk: nn.Linear, wv: nn.Linear, wo: nn.Linear, n_heads: int,
                  causal: bool = True, group: dist.ProcessGroup | None = None
                  ) -> "ParallelSelfAttention":
        """This rank's heads of full projections ``wq, wk, wv, wo`` (each ``nn.Linear(h, h)``)."""
        t = group_size(group)
        d = cls.validate(wq, wk, wv, wo, n_heads, t)
        qkv = ColumnParallelLinear.from_full(grouped_qkv(wq, wk, wv, t), group=group)
        out = RowParallelLinear.from_full(wo, input_is_parallel=True, group=group)
        return cls(qkv, LocalAttention(n_heads, d, causal, t), out)

    @staticmethod
    def validate(wq: nn.Linear, wk: nn.Linear, wv: nn.Linear, wo: nn.Linear, n_heads: int,
                 world_size: int) -> int:
        """The head size ``d``, or ValueError naming what does not fit."""
        h = wq.in_features
        for name, lin in (("wq", wq), ("wk", wk), ("wv", wv), ("wo", wo)):
            if (lin.in_features, lin.out_features) != (h, h):
                raise ValueError(f"{name} is nn.Linear({lin.in_features}, {lin.out_features}); "
                                 f"self-attention needs nn.Linear({h}, {h}) for all four")
            if lin.bias is None:
                raise ValueError(f"{name} has no bias; this layer expects biased projections")
        return check_heads(h, n_heads, world_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)      # f, then [s, b, h] @ [h, 3h/t] -> [s, b, 3h/t]
        ctx = self.core(qkv)   # this rank's a/t heads -> [s, b, h/t]
        return self.out(ctx)   # [s, b, h/t] @ [h/t, h] -> partial [s, b, h] -> g (all-reduce) -> + bo

    def extra_repr(self) -> str:
        return f"rank {group_rank(self.qkv.group)} of {self.core.world_size}"
