"""Deliberately wrong collectives, for ``check_collectives(bug=...)``: each one a realistic slip in
calling the collective, standing in for the correct function of ops.py (marked in a comment)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from mtb_helpers.checking.bug import Bug, register
from mtb_helpers.collectives.ops import (RANK_FUNCTIONS, all_gather, all_to_all, broadcast,
                                         reduce_scatter)

__all__ = ["BUGS", "COLLECTIVE_BUGS"]


def _broadcast_wrong_root(x):
    return broadcast(x, src=dist.get_world_size() - 1)


def _allreduce_lost_inplace(x):
    dist.all_reduce(x.clone())  # reduces a temporary; the caller's tensor is never updated
    return x.clone()


def _allgather_rank_order(x):
    p, rank = dist.get_world_size(), dist.get_rank()
    shards = list(all_gather(x).chunk(p))
    return torch.cat(shards[rank:] + shards[:rank])  # arrival order, own shard first


def _reduce_scatter_wrong_chunk(x):
    chunks = list(x.chunk(dist.get_world_size()))
    return reduce_scatter(torch.cat(chunks[1:] + chunks[:1]))  # rank r gets chunk r+1


def _alltoall_wrong_split(x):
    p = dist.get_world_size()
    return all_to_all(x.view(-1, p).t().reshape(-1))  # element i goes to rank i % p


def _bug(description: str, collective: str, wrong, needs: dict | None = None) -> Bug:
    """``wrong`` in place of ``collective``'s function (``RANK_FUNCTIONS``), needing a second rank,
    that collective among those checked, and ``needs`` if given."""
    return Bug(description, ("collectives",), {RANK_FUNCTIONS[collective]: wrong},
               {"2 or more ranks": lambda a: a["world_size"] >= 2,
                f"the {collective} it breaks among the collectives checked":
                    lambda a: collective in a["collectives"], **(needs or {})})


BUGS: dict[str, Bug] = {
    "broadcast-wrong-root": _bug(
        "broadcast: src is the last rank instead of rank 0, so every rank gets the last rank's buffer",
        "broadcast", _broadcast_wrong_root),
    "allreduce-lost-inplace": _bug(
        "all-reduce: reduces a temporary copy (all_reduce works in place) and returns the untouched "
        "input", "all-reduce", _allreduce_lost_inplace),
    "allgather-rank-order": _bug(
        "all-gather: shards concatenated in ring arrival order (own shard first) instead of by source "
        "rank", "all-gather", _allgather_rank_order),
    "reduce-scatter-wrong-chunk": _bug(
        "reduce-scatter: rank r keeps chunk r+1 of the sum (off by one)", "reduce-scatter",
        _reduce_scatter_wrong_chunk),
    "alltoall-wrong-split": _bug(
        "all-to-all: splits along the wrong dimension, element i goes to rank i mod p instead of "
        "rank i // (numel/p)", "all-to-all", _alltoall_wrong_split,
        {"2 or more elements per rank's chunk": lambda a: a["numel"] // a["world_size"] >= 2}),
}
# Which collective each bug breaks (the check refuses a bug whose collective it does not run).
COLLECTIVE_BUGS: dict[str, str] = {
    name: next(c for c, fn in RANK_FUNCTIONS.items() if fn in bug.replaces)
    for name, bug in BUGS.items()}

register("collectives", BUGS)   # at import: see checking/bug.py
