"""Deliberately wrong context-parallel attention, for ``check_context_parallel(bug=...)``.

Each is a subclass of a correct layer overriding one method (marked ``# BUG``; see
checking/bug.py). A bug's ``checks`` name the variants it concerns (``"cp-ring"``,
``"cp-allgather"``); its ``needs`` the settings (``world_size``, ``causal``, ``layout``) without
which it has nothing to break, so the check refuses it there and the explorer does not offer it.
"""
from __future__ import annotations

import torch

from mtb_helpers.checking.bug import Bug, register
from mtb_helpers.cp.allgather import AllGatherAttention
from mtb_helpers.cp.ring import RingAttention
from mtb_helpers.cp.sharding import shard_sequence

__all__ = ["BUGS"]


class RingWithoutRescale(RingAttention):
    """cp-no-rescale."""

    def update(self, mx, l, acc, scores, v):
        mx_new = torch.maximum(mx, scores.amax(-1, keepdim=True))
        shrink = torch.exp(mx - mx_new)
        p = torch.exp(scores - mx_new)                           # [.., rows, keys]
        # BUG: l is rescaled to the new max but acc is not, so earlier blocks keep the old scale
        return mx_new, l * shrink + p.sum(-1, keepdim=True), acc + p @ v   # p @ v: [.., rows, d]


class RingLocalMask(RingAttention):
    """cp-local-causal-mask (ring)."""

    def positions(self, source: int, rows: int) -> torch.Tensor:
        return torch.arange(rows)   # BUG: local row numbers, the same for every rank's block


class AllGatherLocalMask(AllGatherAttention):
    """cp-local-causal-mask (all-gather)."""

    def positions(self, source: int, rows: int) -> torch.Tensor:
        return torch.arange(rows)   # BUG: this rank's queries numbered from 0, as if they came first


class AllGatherWrongOrder(AllGatherAttention):
    """cp-zigzag-wrong-order."""

    def reassemble(self, gathered: torch.Tensor) -> torch.Tensor:
        return gathered   # BUG: rank order kept, as if every rank held one contiguous chunk


class RingGradsNotHome(RingAttention):
    """cp-grads-not-sent-home."""

    def send_grads_home(self, dkv: torch.Tensor) -> torch.Tensor:
        return dkv   # BUG: no last hop, so rank r keeps the dK, dV of rank r+1's block


class AllGatherNoReduceScatter(AllGatherAttention):
    """cp-allgather-no-reduce-scatter."""

    def scatter_grads(self, dfull: torch.Tensor) -> torch.Tensor:
        # BUG: each rank keeps its own positions of its own dK/dV, never summed over the ranks
        # whose queries also attended to them
        return shard_sequence(dfull, self.cp, self.rank, self.layout, dim=3)


# What a bug needs to show at all; each test reads the check's arguments (``checking.bug.names_for``).
_RANKS = {"2 or more ranks (one rank holds the whole sequence: nothing moves between ranks and "
          "its local positions are the global ones)": lambda a: a["world_size"] >= 2}
_BLOCKS = {"2 or more ranks or the zigzag layout (a query must fold in more than one key block "
           "for a missing rescale to matter)":
           lambda a: a["world_size"] >= 2 or a["layout"] == "zigzag"}
_MASK = {"a causal mask (without one no position is compared, local or global)":
         lambda a: a["causal"]}
_ZIGZAG = {"the zigzag layout (in the contiguous one rank order is position order)":
           lambda a: a["layout"] == "zigzag"}

BUGS: dict[str, Bug] = {
    "cp-no-rescale": Bug(
        "ring attention: the running output is not rescaled when the running max grows, so "
        "earlier key blocks are over-weighted", checks=("cp-ring",),
        replaces={RingAttention: RingWithoutRescale},
        needs=_BLOCKS),
    "cp-local-causal-mask": Bug(
        "context-parallel attention: the causal mask compares local row numbers instead of "
        "global positions", checks=("cp-ring", "cp-allgather"),
        replaces={RingAttention: RingLocalMask, AllGatherAttention: AllGatherLocalMask},
        needs={**_MASK, **_RANKS}),
    "cp-zigzag-wrong-order": Bug(
        "all-gather attention: the gathered zigzag chunks are left in rank order instead of "
        "being put back in position order", checks=("cp-allgather",),
        replaces={AllGatherAttention: AllGatherWrongOrder},
        needs={**_ZIGZAG, **_RANKS}),
    "cp-grads-not-sent-home": Bug(
        "ring attention backward: dK/dV are not sent the last hop back to their owner, so each "
        "rank returns its neighbour's", checks=("cp-ring",),
        replaces={RingAttention: RingGradsNotHome},
        needs=_RANKS),
    "cp-allgather-no-reduce-scatter": Bug(
        "all-gather attention backward: dK/dV are sliced locally instead of reduce-scattered, so "
        "each rank keeps only its own queries' contribution", checks=("cp-allgather",),
        replaces={AllGatherAttention: AllGatherNoReduceScatter},
        needs=_RANKS),
}


register("cp", BUGS)   # at import: see checking/bug.py
