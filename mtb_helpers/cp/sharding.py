"""Sequence shards for context parallelism: which global positions each rank holds.

The sequence (dim 2 of ``[b, heads, s, d]``) is cut into chunks:

* ``contiguous``: ``cp`` chunks of ``s/cp``; rank ``r`` holds chunk ``r``.
* ``zigzag``: ``2·cp`` chunks of ``s/(2·cp)``; rank ``r`` holds chunks ``r`` and ``2·cp-1-r`` (in
  that order). Under a causal mask chunk ``c`` attends to ``c+1`` chunks, so every rank gets
  ``(r+1) + (2·cp-r) = 2·cp+1`` chunk pairs of work: the load-balanced layout (Megatron-LM context
  parallelism, ring-flash-attention's ``zigzag_ring_flash_attn``).

    >>> [shard_positions(8, 2, r, "zigzag").tolist() for r in range(2)]
    [[0, 1, 6, 7], [2, 3, 4, 5]]
"""
from __future__ import annotations

import torch

__all__ = ["LAYOUTS", "check_sequence", "check_world", "chunk_ids", "chunk_len", "shard_positions",
           "shard_sequence", "unshard_sequence"]

LAYOUTS = ("contiguous", "zigzag")


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")


def check_world(world_size: int, rank: int | None = None) -> None:
    """ValueError naming the argument unless ``world_size >= 1`` and ``0 <= rank < world_size``."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be a positive integer")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)
                             or not 0 <= rank < world_size):
        raise ValueError(f"rank={rank!r} must lie in [0, {world_size}) for world_size={world_size}")


def check_sequence(seq: int, world_size: int, layout: str) -> None:
    """Refuse (ValueError naming the sizes) a sequence the layout cannot cut evenly."""
    check_layout(layout)
    check_world(world_size)
    pieces = world_size * (2 if layout == "zigzag" else 1)
    if seq % pieces:
        why = (f"2 x world size = {pieces} chunks (zigzag gives each rank two)"
               if layout == "zigzag" else f"the world size {world_size}")
        raise ValueError(f"seq={seq} is not divisible by {why}: every rank must hold the same "
                         f"number of positions")


def chunk_ids(world_size: int, rank: int, layout: str) -> list[int]:
    """The global chunk indices rank ``rank`` holds, in the order its shard stores them."""
    check_layout(layout)
    check_world(world_size, rank)
    if layout == "contiguous":
        return [rank]
    return [rank, 2 * world_size - 1 - rank]


def chunk_len(seq: int, world_size: int, layout: str) -> int:
    """Positions per chunk: ``s/cp`` (contiguous) or ``s/(2·cp)`` (zigzag)."""
    check_world(world_size)
    return seq // (world_size * (2 if layout == "zigzag" else 1))


def shard_positions(seq: int, world_size: int, rank: int, layout: str = "contiguous"
                    ) -> torch.Tensor:
    """The global positions of rank ``rank``'s ``s/cp`` rows, in shard order (int64)."""
    size = chunk_len(seq, world_size, layout)
    return torch.cat([torch.arange(c * size, (c + 1) * size) for c in chunk_ids(world_size, rank, layout)])


def shard_sequence(x: torch.Tensor, world_size: int, rank: int, layout: str = "contiguous",
                   dim: int = 2) -> torch.Tensor:
    """Rank ``rank``'s shard of ``x`` along ``dim``: ``[.., s, ..] -> [.., s/cp, ..]`` (a copy)."""
    dim = _check_dim(dim, x.dim())
    check_world(world_size, rank)
    check_sequence(x.shape[dim], world_size, layout)
    size = chunk_len(x.shape[dim], world_size, layout)
    return torch.cat([x.narrow(dim, c * size, size) for c in chunk_ids(world_size, rank, layout)],
                     dim=dim).contiguous()


def _check_dim(dim: int, ndim: int) -> int:
    """``dim`` as a non-negative index, or ValueError naming it."""
    if isinstance(dim, bool) or not isinstance(dim, int) or not -ndim <= dim < ndim:
        raise ValueError(f"dim={dim!r} is out of range for a tensor of {ndim} dims")
    return dim % ndim


def unshard_sequence(shards: list[torch.Tensor], layout: str = "contiguous",
                     dim: int = 2) -> torch.Tensor:
    """The full tensor from every rank's shard (``shards[r]`` from rank r), positions in order:
    ``cp x [.., s/cp, ..] -> [.., s, ..]``."""
    cp = len(shards)
    if cp == 0:
        raise ValueError("shards is empty: pass every rank's shard, shards[r] from rank r")
    dim = _check_dim(dim, shards[0].dim())
    lengths = [shard.shape[dim] for shard in shards]
    if len(set(lengths)) > 1:
        raise ValueError(f"shards must all hold the same number of positions; got {lengths}")
    seq = shards[0].shape[dim] * cp
    check_sequence(seq, cp, layout)
    size = chunk_len(seq, cp, layout)
    pieces: dict[int, torch.Tensor] = {}
    for r, shard in enumerate(shards):
        for i, c in enumerate(chunk_ids(cp, r, layout)):
            pieces[c] = shard.narrow(dim, i * size, size)
    return torch.cat([pieces[c] for c in sorted(pieces)], dim=dim)
