"""Contiguous shards of one dimension: who holds which slice, and the refusal when it does not divide.

Every parallel layer of the course cuts a dimension of size ``n`` into ``t`` equal contiguous
pieces in rank order: rank ``r`` holds ``[r*n/t, (r+1)*n/t)``.
"""
from __future__ import annotations

__all__ = ["check_divisible", "shard_range"]


def check_divisible(what: str, size: int, world_size: int) -> None:
    """Raise ValueError unless ``world_size`` divides dimension ``what`` of size ``size``."""
    if size % world_size:
        raise ValueError(f"{what}={size} is not divisible by the world size {world_size}: "
                         f"tensor parallelism splits it into {world_size} equal shards")


def shard_range(size: int, world_size: int, rank: int) -> tuple[int, int]:
    """``(start, stop)`` of rank ``rank``'s contiguous shard of a dimension of size ``size``."""
    step = size // world_size
    return rank * step, (rank + 1) * step
