"""Position-keyed dropout: the mask of each element is a hash of its global position and the seed.

Under sequence parallelism each rank holds other rows of the ``[s, b, h]`` activation, so each
must draw its own part of one global mask; drawing the same mask on every shard (or a different
one at every world size) breaks the comparison with one process. Keying the mask by the global
position ``(i, j, k)`` and the seed gives every shard its part of the one mask, whatever the world
size, and the one-process reference uses the very same mask (Megatron-LM uses per-rank RNG
streams instead).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from mtb_helpers.comm.mesh import group_rank
from mtb_helpers.comm.sharding import Replicate, Shard

__all__ = ["keep_mask", "position_keyed_dropout", "PositionKeyedDropout"]

_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash on int64 tensors holding values in [0, 2^32). Both multipliers are
    below 2^31, so no product leaves int64."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & _M32
    return x ^ (x >> 16)


def keep_mask(shape: tuple[int, ...], p: float, seed: int, row_offset: int = 0) -> torch.Tensor:
    """Bool keep-mask ``[n, ..]`` for rows ``row_offset .. row_offset+n`` of a global tensor whose
    rows have shape ``shape[1:]``; element keeps iff hash(seed, global flat index) >= p * 2^32.

    It depends on the global position only, so rank r's shard of the mask is the same at every
    world size and equals rows ``r*s/t ..`` of ``keep_mask([s, ..], p, seed)``.
    """
    inner = math.prod(shape[1:])
    idx = torch.arange(row_offset * inner, (row_offset + shape[0]) * inner, dtype=torch.int64)
    key = _mix32(torch.tensor((seed & _M32) ^ 0x9E3779B9, dtype=torch.int64))
    h = _mix32(_mix32((idx & _M32) ^ key) ^ (idx >> 32))
    return (h.double() / 2.0 ** 32 >= p).reshape(shape)


def position_keyed_dropout(x: torch.Tensor, p: float, seed: int, row_offset: int = 0) -> torch.Tensor:
    """``x * mask / (1 - p)`` with ``mask = keep_mask(x.shape, p, seed, row_offset)``; ``x`` is
    rows ``row_offset ..`` of the global tensor (dim 0 = sequence)."""
    if p == 0:
        return x
    # where() keeps only the bool mask for backward: 1 byte per element, as in Korthikanti's model
    return torch.where(keep_mask(tuple(x.shape), p, seed, row_offset), x * (1.0 / (1.0 - p)), 0.0)


class PositionKeyedDropout(nn.Module):
    """Dropout whose mask is keyed by global position and seed. ``x``: ``[s/t, b, h]`` (this
    rank's sequence shard, ``sequence_parallel=True``) or the whole ``[s, b, h]``."""

    @property
    def input_layouts(self) -> Replicate | Shard:
        return Shard(0) if self.sequence_parallel else Replicate()

    output_layouts = input_layouts

    def __init__(self, p: float = 0.1, seed: int = 0, sequence_parallel: bool = True, group=None):
        super().__init__()
        if not 0 <= p < 1:
            raise ValueError(f"dropout p must be in [0, 1), got {p!r}")
        self.p, self.seed, self.sequence_parallel, self.group = p, seed, sequence_parallel, group

    def row_offset(self, x: torch.Tensor) -> int:
        """Global index of this rank's first sequence row."""
        return group_rank(self.group) * x.shape[0] if self.sequence_parallel else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:   # nothing dropped: no mask, no rank to ask
            return x
        return position_keyed_dropout(x, self.p, self.seed, self.row_offset(x))

    def extra_repr(self) -> str:
        return f"p={self.p}, seed={self.seed}, sequence_parallel={self.sequence_parallel}"
