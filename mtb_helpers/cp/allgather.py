"""All-gather attention (the Llama 3 variant): gather all of K and V, attend, reduce-scatter dK, dV.

Llama 3's context parallelism (Dubey et al. 2024, section 3.3.2) all-gathers K and V and
computes each local query chunk against the keys it may see: with a causal mask chunk c needs
only the prefix of keys before its end, so the work per rank is the same as the ring's. The
all-gather cost does not hide behind compute the way ring hops do, but with grouped-query
attention K/V are much smaller than Q, so Llama 3 chose it for simplicity.

    kv [2, b, heads, s/cp, d] -> all-gather -> [2, b, heads, s, d] in rank order -> reassemble -> position order
    backward: dKV [2, b, heads, s, d] -> cut into rank order -> reduce-scatter -> [2, b, heads, s/cp, d]

Bytes one rank sends (n = bytes of its K shard): forward ``2 (cp-1) n``, backward ``2 (cp-1) n``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from mtb_helpers.comm.records import note
from mtb_helpers.comm.regions import _REDUCE_SCATTER
from mtb_helpers.cp.base import ContextParallelAttention, kept_in
from mtb_helpers.cp.sharding import shard_sequence, unshard_sequence

__all__ = ["AllGatherAttention", "allgather_attention", "GATHER_KV"]

GATHER_KV = "cp.gather-kv"


class _GatherKV(torch.autograd.Function):
    """forward: all-gather K/V along the sequence; backward: reduce-scatter dK/dV."""

    @staticmethod
    def forward(ctx, kv, layer):
        ctx.layer = layer
        with kept_in(layer.record):
            gathered = kv
            if layer.cp > 1:   # one rank: nothing to gather (still named in the record, 0 B sent)
                parts = [torch.empty_like(kv) for _ in range(layer.cp)]
                dist.all_gather(parts, kv, group=layer.group)   # cp x [2,b,heads,s/cp,d], rank order
                gathered = torch.cat(parts, dim=3)               # -> [2,b,heads,s,d]
            note("all_gather", kv, gathered, GATHER_KV, "", "forward", layer.cp)
        return layer.reassemble(gathered)

    @staticmethod
    def backward(ctx, dfull):
        with kept_in(ctx.layer.record):
            return ctx.layer.scatter_grads(dfull.contiguous()), None


class AllGatherAttention(ContextParallelAttention):
    """Attention of this rank's query shard over the all-gathered K/V."""

    @classmethod
    def attend(cls, layers, shards):
        """One layer after the other (each gathers its own K/V)."""
        return [layer.forward(*triple) for layer, triple in zip(layers, shards)]

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """This rank's output shard; every rank already agreed on the shapes (``together``)."""
        rows = q.shape[2]
        full = _GatherKV.apply(torch.stack([k, v]), self)   # [2,b,heads,s/cp,d] -> [2,b,heads,s,d]
        self.hold(full)
        q_pos = self.positions(self.rank, rows)
        key_pos = torch.arange(full.shape[3])               # gathered keys are in position order
        outs = []
        size = rows // self.chunks
        for i in range(self.chunks):
            qs = slice(i * size, (i + 1) * size)
            end = int(q_pos[qs].max()) + 1 if self.causal else full.shape[3]
            mask = key_pos[None, :end] <= q_pos[qs][:, None] if self.causal else None
            s = self.scores(q[:, :, qs], full[0][:, :, :end], mask, "forward")   # [b,heads,nq,end]
            outs.append(torch.softmax(s, dim=-1) @ full[1][:, :, :end])  # [b,heads,nq,end] @ [b,heads,end,d]
        # autograd's backward builds dS, dP of the very shapes the forward built: the same work
        self.work["backward"], self.pairs["backward"] = self.work["forward"], self.pairs["forward"]
        return torch.cat(outs, dim=2)                        # -> [b,heads,s/cp,d]

    def reassemble(self, gathered: torch.Tensor) -> torch.Tensor:
        """Rank-order shards -> position order (zigzag shards hold two chunks each)."""
        return unshard_sequence(list(gathered.chunk(self.cp, dim=3)), self.layout, dim=3)

    def scatter_grads(self, dfull: torch.Tensor) -> torch.Tensor:
        """dK/dV of every position summed over ranks; this rank keeps its own positions."""
        ranked = torch.cat([shard_sequence(dfull, self.cp, r, self.layout, dim=3)
                            for r in range(self.cp)], dim=3)   # position order -> rank order
        mine = ranked
        if self.cp > 1:   # one rank: its dK/dV are already the sum (still recorded, 0 B sent)
            full = ranked.movedim(3, 0).contiguous()          # [s,2,b,heads,d]: each rank's rows together
            mine = full.new_empty((full.shape[0] // self.cp, *full.shape[1:]))
            getattr(dist, _REDUCE_SCATTER)(mine, full, group=self.group)   # reduce-scatter -> [s/cp,2,b,heads,d]
            mine = mine.movedim(0, 3).contiguous()            # -> [2,b,heads,s/cp,d]
        note("reduce_scatter", ranked, mine, GATHER_KV, "", "backward", self.cp)
        return mine


def allgather_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                        layout: str = "contiguous", group=None) -> torch.Tensor:
    """Same contract as ``ring_attention``: this rank's ``[b, heads, s/cp, d]`` shards in, its
    output shard out; K/V all-gathered, dK/dV reduce-scattered."""
    return AllGatherAttention(causal, layout, group)(q, k, v)
