"""What both context-parallel attentions share: shapes, global positions, the chunk pairs a causal
mask leaves to compute, the shape agreement at the entry of a call, and the measurements
(work, K/V memory, the layer's own messages) the check reads back.

Inputs and output are this rank's sequence shard ``[b, heads, s/cp, d]`` as
``shard_sequence(x, cp, r, layout, dim=2)`` cut it. A shard holds 1 chunk (contiguous) or 2
(zigzag); work is done chunk pair by chunk pair, and under a causal mask a pair whose keys all
come after its queries is skipped: that skipping is where the causal imbalance comes from.
"""
from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
import torch.distributed as dist

from mtb_helpers.comm.mesh import agree, group_rank, group_size
from mtb_helpers.comm.records import CollectiveRecord, record
from mtb_helpers.comm.sharding import Shard
from mtb_helpers.cp.sharding import check_layout, check_sequence, shard_positions

__all__ = ["ContextParallelAttention", "kept_in"]


class ContextParallelAttention:
    """Base of ``RingAttention`` and ``AllGatherAttention``; call it on ``q, k, v`` shards.

    After a call, ``work[direction]`` is the number of attention scores (query-key products)
    this rank computed per (batch, head), ``pairs[direction]`` the chunk pairs, and
    ``kv_peak_bytes`` the most K/V bytes it held at once, ``record`` the messages it sent (a
    ``CollectiveRecord``; an enclosing ``with record()`` sees them too). ``together`` runs several
    layers (a check's layouts) as one call."""
    # q, k, v [b, heads, s/cp, d]: this rank's positions of the sequence, and the output at those
    # same query positions. Zigzag is Shard(2) of the sequence in zigzag chunk order (cp/sharding),
    # as PyTorch's context_parallel load balancer reorders the sequence before sharding it.
    input_layouts = (Shard(2), Shard(2), Shard(2))
    output_layouts = Shard(2)

    def __init__(self, causal: bool = False, layout: str = "contiguous",
                 group: dist.ProcessGroup | None = None):
        check_layout(layout)
        self.causal, self.layout, self.group = bool(causal), layout, group
        self.cp, self.rank = group_size(group), group_rank(group)
        self.chunks = 2 if layout == "zigzag" else 1
        self.work = {"forward": 0, "backward": 0}
        self.pairs = {"forward": 0, "backward": 0}
        self.kv_peak_bytes = 0
        self.steps: list[dict] = []
        self.record = CollectiveRecord()   # this layer's own messages (also in any record())

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """This rank's output shard ``[b, heads, s/cp, d]``, differentiable."""
        return self.together([self], [(q, k, v)])[0]

    @classmethod
    def together(cls, layers: list[ContextParallelAttention],
                 shards: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """Each layer on its own ``(q, k, v)`` shards, as one call: the ranks agree once on the
        shapes of every layer's shards (one small all-gather), then ``attend`` runs the layers
        (the ring runs their rings in lockstep, one message per hop for all of them)."""
        if len(layers) != len(shards) or not layers:
            raise ValueError(f"together() needs one (q, k, v) per layer, got {len(layers)} layers "
                             f"and {len(shards)} shard triples")
        if any(layer.group is not layers[0].group for layer in layers):
            raise ValueError("together() runs layers of one process group")
        _check_same_shards_everywhere(layers[0].group, shards)
        for layer, (q, k, v) in zip(layers, shards):
            layer._validate(q, k, v)
        return cls.attend(layers, shards)

    @classmethod
    def attend(cls, layers: list[ContextParallelAttention],
               shards: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """The layers' outputs, shapes already agreed (each variant says how)."""
        raise NotImplementedError

    def _validate(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Local checks, after every rank agreed on the shapes (so all ranks raise alike)."""
        if not (q.dim() == 4 and q.shape == k.shape == v.shape):
            raise ValueError(f"q, k, v must be [b, heads, s/cp, d] shards of one shape; got "
                             f"{list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
        check_sequence(q.shape[2] * self.cp, self.cp, self.layout)
        self.scale = 1.0 / math.sqrt(q.shape[-1])

    def positions(self, source: int, rows: int) -> torch.Tensor:
        """Global positions of the ``rows`` rows rank ``source`` holds (the causal mask compares these)."""
        return shard_positions(rows * self.cp, self.cp, source, self.layout)

    def chunk_pairs(self, q_pos: torch.Tensor, k_pos: torch.Tensor):
        """``(q rows, k rows, mask)`` for every chunk pair to compute: ``mask[i, j]`` is True
        where key j may be seen by query i (None: all of them); fully masked pairs are skipped."""
        rows = q_pos.numel() // self.chunks
        for i in range(self.chunks):
            for j in range(self.chunks):
                qs, ks = slice(i * rows, (i + 1) * rows), slice(j * rows, (j + 1) * rows)
                if not self.causal:
                    yield qs, ks, None
                    continue
                mask = k_pos[ks][None, :] <= q_pos[qs][:, None]     # [rows, rows] from global positions
                if mask.any():
                    yield qs, ks, mask

    def scores(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None,
               direction: str) -> torch.Tensor:
        """``q k^T / sqrt(d)``, ``-inf`` where masked; counted as work."""
        s = q @ k.transpose(-2, -1) * self.scale     # [b,heads,nq,d] @ [b,heads,d,nk] -> [b,heads,nq,nk]
        self.work[direction] += s.shape[-2] * s.shape[-1]
        self.pairs[direction] += 1
        return s if mask is None else s.masked_fill(~mask, -math.inf)

    def hold(self, *tensors: torch.Tensor) -> None:
        """Note K/V tensors alive at once (for the memory comparison)."""
        self.kv_peak_bytes = max(self.kv_peak_bytes,
                                 sum(x.numel() * x.element_size() for x in tensors))


def _check_same_shards_everywhere(group: dist.ProcessGroup | None,
                                  shards: list[tuple[torch.Tensor, ...]]) -> None:
    """ValueError on every rank unless every rank holds q, k, v shards of the same shapes (for
    every layer of the call). Gloo does not refuse unequal ring hops or all-gathers: it aborts the
    process ("Received data size doesn't match expected size") or hangs. One small all-gather of
    the shapes first (not in the collective record: it checks, it moves none of the data) lets
    every rank see the same mismatch and raise the same error, naming each rank's length."""
    if group_size(group) == 1:
        return
    # one fixed-size row per tensor, whatever it is: [ndim, its first 4 sizes padded with -1]
    mine = torch.tensor([[x.dim(), *(list(x.shape[:4]) + [-1] * 4)[:4]]
                         for triple in shards for x in triple], dtype=torch.int64)   # [3 x layers, 5]
    codes = [code.tolist() for code in agree(mine, group)]           # cp x [3 x layers, 5], rank order
    if all(code == codes[0] for code in codes):
        return
    first = next(i for i in range(0, len(codes[0]), 3)
                 if any(code[i:i + 3] != codes[0][i:i + 3] for code in codes))   # a layer's q, k, v
    shapes = [[[size for size in row[1:] if size >= 0] for row in code[first:first + 3]] for code in codes]
    lengths = ", ".join(f"rank {r}: {qs[2] if len(qs) > 2 else '?'}"
                        for r, (qs, _, _) in enumerate(shapes))
    held = "; ".join(f"rank {r}: " + (f"{qs}" if qs == ks == vs else f"q {qs}, k {ks}, v {vs}")
                     for r, (qs, ks, vs) in enumerate(shapes))
    raise ValueError(
        f"context-parallel attention needs shards of one shape [b, heads, s/cp, d] on every "
        f"rank (shard_sequence(x, cp, r, layout, dim=2) cuts them so); the sequence length "
        f"(dim 2) per rank is {lengths}; shapes held: {held}")


@contextlib.contextmanager
def kept_in(rec: CollectiveRecord | None) -> Iterator[None]:
    """Events noted inside go to every active record as usual, and also to ``rec``."""
    if rec is None:
        yield
        return
    with record() as part:
        yield
    rec.events.extend(part.events)
    rec.tensors.extend([None] * len(part.events))
