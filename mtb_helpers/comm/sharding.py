"""Contiguous shards of one dimension: who holds which slice, and the refusal when it does not divide.

Every parallel layer of the course cuts a dimension of size ``n`` into ``t`` equal contiguous
pieces in rank order: rank ``r`` holds ``[r*n/t, (r+1)*n/t)``.

Layouts (the idea of PyTorch's placements ``Replicate`` / ``Shard(dim)`` / ``Partial``): every
parallel layer states the layout of its input and output as ``input_layout`` / ``output_layout``,
and the checks, traces and figures read them from the layer instead of restating them.

    REPLICATED  every rank holds the whole tensor
    COLS        sharded on the last dim: rank r holds ``[.., n/t]`` (a column-parallel output)
    ROWS        sharded on the first dim: rank r holds ``[s/t, ..]`` (a sequence shard, ``[s, b, h]``)
    PARTIAL     every rank holds a full-shape addend; the true tensor is their sum
"""
from __future__ import annotations

__all__ = ["check_divisible", "shard_range", "REPLICATED", "COLS", "ROWS", "PARTIAL", "local_piece"]

REPLICATED, COLS, ROWS, PARTIAL = "replicated", "cols", "rows", "partial"


def check_divisible(what: str, size: int, world_size: int) -> None:
    """Raise ValueError unless ``world_size`` divides dimension ``what`` of size ``size``."""
    if size % world_size:
        raise ValueError(f"{what}={size} is not divisible by the world size {world_size}: "
                         f"tensor parallelism splits it into {world_size} equal shards")


def shard_range(size: int, world_size: int, rank: int) -> tuple[int, int]:
    """``(start, stop)`` of rank ``rank``'s contiguous shard of a dimension of size ``size``."""
    step = size // world_size
    return rank * step, (rank + 1) * step


def local_piece(x, layout: str, world_size: int, rank: int):
    """Rank ``rank``'s piece of the full tensor ``x`` in ``layout`` (not ``PARTIAL``: a sum has
    no piece to cut)."""
    if layout == REPLICATED:
        return x
    if layout == COLS:
        lo, hi = shard_range(x.shape[-1], world_size, rank)
        return x[..., lo:hi]
    if layout == ROWS:
        lo, hi = shard_range(x.shape[0], world_size, rank)
        return x[lo:hi]
    raise ValueError(f"no local piece for layout {layout!r}")
