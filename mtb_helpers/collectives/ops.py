"""The five collectives on real ranks, checked against one process, with the bytes each rank sends.

Notation (the course's glossary): ``p`` ranks; ``n`` the size of the full (logical) tensor, in
elements in a shape such as [n], in bytes in FORMULAS.

    broadcast       rank 0's [n] -> every rank's [n]
    all-reduce      every rank's [n] -> their sum [n] on every rank
    all-gather      rank r's shard [n/p] -> the concatenation [n] (shards in rank order) everywhere
    reduce-scatter  every rank's [n] -> rank r keeps chunk r of the sum, [n/p]
    all-to-all      rank r's [n] in p chunks -> chunk j goes to rank j; rank r gets [n] made of
                    chunk r of every rank, in rank order

Inputs are integer-valued (rank r holds ``10*r + d`` with a seeded digit d), so every result is
exact in float32 and float64: the check's tolerance is 0 and any difference is a bug.

The check, its report and the byte measurements live in :mod:`mtb_helpers.collectives.check`.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist


COLLECTIVES: tuple[str, ...] = ("broadcast", "all-reduce", "all-gather", "reduce-scatter",
                                "all-to-all")
FORMULAS: dict[str, str] = {
    "broadcast": "binomial tree: rank r sends n per child, the root ceil(log2 p)·n "
                 "(a pipelined ring: n per rank, 0 for the last)",
    "all-reduce": "2(p-1)/p·n",
    "all-gather": "(p-1)/p·n",
    "reduce-scatter": "(p-1)/p·n",
    "all-to-all": "(p-1)/p·n",
}
GLOO_HEADER_BYTES = 48   # gloo's TCP transport prefixes every message with six 8-byte fields
# Why a measurement can differ from its formula (shown when it does).
MEASURED_NOTES: dict[str, str] = {
    "reduce-scatter": "gloo has no ring reduce-scatter: it all-reduces the whole buffer and keeps "
                      "chunk r, so it sends 2(p-1)/p·n; NCCL's ring (and ring_reduce_scatter here) "
                      "sends (p-1)/p·n",
    "all-reduce": "gloo cuts a small buffer into uneven pieces, so ranks send a little more or "
                  "less than 2(p-1)/p·n; the total over ranks matches",
}

# ---------------------------------------------------------------- rank side (inside a rank)


def broadcast(x: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Inside a rank: ``x`` [n] -> rank ``src``'s [n] on every rank."""
    out = x.clone()
    dist.broadcast(out, src=src)
    return out


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Inside a rank: ``x`` [n] -> the sum over ranks [n]. all_reduce works in place."""
    out = x.clone()
    dist.all_reduce(out)
    return out


def all_gather(x: torch.Tensor) -> torch.Tensor:
    """Inside a rank: this rank's shard [n/p] -> every shard, in rank order [n]."""
    out = x.new_empty(x.numel() * dist.get_world_size())
    # torch 2.13 renamed all_gather_into_tensor; Colab's older torch only has the old name.
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, x.contiguous())
    return out


def reduce_scatter(x: torch.Tensor) -> torch.Tensor:
    """Inside a rank: ``x`` [n] -> chunk ``rank`` of the sum over ranks [n/p]."""
    p, rank = dist.get_world_size(), dist.get_rank()
    out = x.new_empty(x.numel() // p)
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    try:
        fn(out, x.contiguous())
    except RuntimeError as exc:  # older gloo builds have no reduce-scatter: the same result
        if "support" not in str(exc):
            raise
        total = x.clone()
        dist.all_reduce(total)
        out = total.chunk(p)[rank].clone()
    return out


def all_to_all(x: torch.Tensor) -> torch.Tensor:
    """Inside a rank: ``x`` [n] as p chunks [n/p]; chunk j goes to rank j. Returns [n]: chunk
    ``rank`` of every rank, in rank order (a transpose of the [p, p] grid of chunks)."""
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x.contiguous())
    return out


RANK_FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "broadcast": broadcast, "all-reduce": all_reduce, "all-gather": all_gather,
    "reduce-scatter": reduce_scatter, "all-to-all": all_to_all}


def ring_all_gather(x: torch.Tensor) -> torch.Tensor:
    """Inside a rank: all-gather [n/p] -> [n] from point-to-point messages around a ring.

    In step s every rank passes the shard it received last (its own at s=0) to rank r+1 and
    receives a new one from rank r-1: p-1 messages of a shard [n/p], (p-1)/p of the tensor's bytes."""
    p, rank = dist.get_world_size(), dist.get_rank()
    shards = [torch.empty_like(x) for _ in range(p)]
    shards[rank] = x.clone()
    for step in range(p - 1):
        send_idx, recv_idx = (rank - step) % p, (rank - step - 1) % p
        req = dist.isend(shards[send_idx], dst=(rank + 1) % p)
        dist.recv(shards[recv_idx], src=(rank - 1) % p)
        req.wait()
    return torch.cat(shards)


def ring_reduce_scatter(x: torch.Tensor) -> torch.Tensor:
    """Inside a rank: reduce-scatter [n] -> [n/p] around a ring, the way NCCL does it.

    Chunk k starts on rank k+1 and travels p-1 hops, each rank adding its own chunk k, so it
    ends summed on rank k: p-1 messages of a chunk [n/p], (p-1)/p of the tensor's bytes."""
    p, rank = dist.get_world_size(), dist.get_rank()
    chunks = [c.clone() for c in x.chunk(p)]
    for step in range(p - 1):
        send_idx, recv_idx = (rank - step - 1) % p, (rank - step - 2) % p
        incoming = torch.empty_like(chunks[recv_idx])
        req = dist.isend(chunks[send_idx], dst=(rank + 1) % p)
        dist.recv(incoming, src=(rank - 1) % p)
        req.wait()
        chunks[recv_idx] += incoming
    return chunks[rank]


# ---------------------------------------------------------------- the single-process side


def rank_input(collective: str, rank: int, world_size: int, numel: int,
               dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    """Rank ``rank``'s input for ``collective``: ``10*rank + d`` with seeded digits d in 0..9, so
    the tens digit names the rank it came from and every sum stays exact. ``[n/p]`` for
    all-gather (its shard), ``[n]`` otherwise."""
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    size = numel // world_size if collective == "all-gather" else numel
    digits = torch.randint(0, 10, (size,), generator=gen)
    return (10 * rank + digits).to(dtype)


def reference(collective: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """What every rank must hold after ``collective``, computed in one process from all inputs."""
    p = len(inputs)
    if collective == "broadcast":
        return [inputs[0].clone() for _ in range(p)]
    if collective == "all-gather":
        return [torch.cat(inputs) for _ in range(p)]
    if collective == "all-to-all":
        return [torch.cat([x.chunk(p)[r] for x in inputs]) for r in range(p)]
    total = torch.stack(inputs).sum(dim=0)
    if collective == "all-reduce":
        return [total.clone() for _ in range(p)]
    return [c.clone() for c in total.chunk(p)]  # reduce-scatter


def _tree_children(rank: int, world_size: int) -> int:
    # Binomial tree rooted at 0 (gloo's broadcast): rank r forwards to r + 2^k for 2^k > r.
    return sum(1 for k in range(world_size.bit_length())
               if 2 ** k > rank and rank + 2 ** k < world_size)


def formula_bytes(collective: str, world_size: int, nbytes: float) -> list[float]:
    """Bytes each rank sends by the textbook algorithm; ``nbytes`` = n, the full tensor's bytes
    (all-gather's output, reduce-scatter's input). Rings for all but broadcast (binomial tree)."""
    p = world_size
    if collective == "broadcast":
        return [float(nbytes * _tree_children(r, p)) for r in range(p)]
    factor = 2 if collective == "all-reduce" else 1  # all-reduce = reduce-scatter + all-gather
    return [factor * (p - 1) / p * nbytes] * p


def decode_sources(tag: float, world_size: int) -> list[int]:
    """The ranks whose data reached a cell: bit r of the provenance tag. The check
    (``collectives/check.py``) runs each collective a second time on inputs where rank r's every
    element is ``2**r``, so a summed cell carries one bit per rank that contributed."""
    if tag != int(tag) or not 0 < tag < 2 ** world_size:
        return []
    return [r for r in range(world_size) if int(tag) >> r & 1]
