"""Deliberately wrong collectives, for ``check_collectives(bug=...)``: each one a realistic slip in
calling the collective, standing in for the correct function of ops.py (marked in a comment)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from mtb_helpers.checking.bug import Bug, register
from mtb_helpers.collectives.ops import (RANK_FUNCTIONS, all_gather, all_reduce, all_to_all,
                                         broadcast, reduce_scatter)

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


def _shows(collective: str) -> dict:
    """What a bug in ``collective`` needs to show: a second rank, and that collective checked."""
    return {"2 or more ranks": lambda a: a["world_size"] >= 2,
            f"the {collective} it breaks among the collectives checked":
                lambda a: collective in a["collectives"]}


BUGS: dict[str, Bug] = {
    "broadcast-wrong-root": Bug(
        "broadcast: src is the last rank instead of rank 0, so every rank gets the last rank's buffer",
        checks=("collectives",), replaces={broadcast: _broadcast_wrong_root},
        needs=_shows("broadcast")),
    "allreduce-lost-inplace": Bug(
        "all-reduce: reduces a temporary copy (all_reduce works in place) and returns the untouched "
        "input",
        checks=("collectives",), replaces={all_reduce: _allreduce_lost_inplace},
        needs=_shows("all-reduce")),
    "allgather-rank-order": Bug(
        "all-gather: shards concatenated in ring arrival order (own shard first) instead of by source "
        "rank",
        checks=("collectives",), replaces={all_gather: _allgather_rank_order},
        needs=_shows("all-gather")),
    "reduce-scatter-wrong-chunk": Bug('reduce-scatter: rank r keeps chunk r+1 of the sum (off by one)',
        checks=("collectives",), replaces={reduce_scatter: _reduce_scatter_wrong_chunk},
        needs=_shows("reduce-scatter")),
    "alltoall-wrong-split": Bug(
        "all-to-all: splits along the wrong dimension, element i goes to rank i mod p instead of "
        "rank i // (numel/p)",
        checks=("collectives",), replaces={all_to_all: _alltoall_wrong_split},
        needs={**_shows("all-to-all"), "2 or more elements per rank's chunk":
               lambda a: a["numel"] // a["world_size"] >= 2}),
}
# Which collective each bug breaks (the check refuses a bug whose collective it does not run).
COLLECTIVE_BUGS: dict[str, str] = {
    name: next(c for c, fn in RANK_FUNCTIONS.items() if fn in bug.replaces)
    for name, bug in BUGS.items()}

register("collectives", BUGS)   # at import: see checking/bug.py
