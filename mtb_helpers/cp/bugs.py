"""Deliberately wrong context-parallel attention, for ``check_context_parallel(bug=...)``.

Each is a subclass of a correct layer overriding one method (marked ``# BUG``), so a notebook can
show it with ``inspect.getsource`` and the layers carry no test-only code. A bug's ``checks`` name
the variants it concerns: ``"cp-ring"`` and/or ``"cp-allgather"``.
"""
from __future__ import annotations

import torch

from mtb_helpers.checking.bug import Bug
from mtb_helpers.cp.allgather import AllGatherAttention
from mtb_helpers.cp.ring import RingAttention
from mtb_helpers.cp.sharding import shard_sequence

__all__ = ["BUGS"]


class RingWithoutRescale(RingAttention):
    """cp-no-rescale."""

    def update(self, m, l, acc, scores, v):
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
        alpha = torch.exp(m - m_new)
        p = torch.exp(scores - m_new)                            # [.., n, k]
        # BUG: l is rescaled to the new max but acc is not, so earlier blocks keep the old scale
        return m_new, l * alpha + p.sum(-1, keepdim=True), acc + p @ v   # p @ v: [.., n, d]


class RingLocalMask(RingAttention):
    """cp-local-causal-mask (ring)."""

    def positions(self, source: int, n: int) -> torch.Tensor:
        return torch.arange(n)   # BUG: local row numbers, the same for every rank's block


class AllGatherLocalMask(AllGatherAttention):
    """cp-local-causal-mask (all-gather)."""

    def positions(self, source: int, n: int) -> torch.Tensor:
        return torch.arange(n)   # BUG: this rank's queries numbered from 0, as if they came first


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
        return shard_sequence(dfull, self.t, self.rank, self.layout, dim=3)


BUGS: dict[str, Bug] = {
    "cp-no-rescale": Bug(
        "ring attention: the running output is not rescaled when the running max grows, so "
        "earlier key blocks are over-weighted", checks=("cp-ring",),
        replaces={RingAttention: RingWithoutRescale}),
    "cp-local-causal-mask": Bug(
        "context-parallel attention: the causal mask compares local row numbers instead of "
        "global positions", checks=("cp-ring", "cp-allgather"),
        replaces={RingAttention: RingLocalMask, AllGatherAttention: AllGatherLocalMask}),
    "cp-zigzag-wrong-order": Bug(
        "all-gather attention: the gathered zigzag chunks are left in rank order instead of "
        "being put back in position order", checks=("cp-allgather",),
        replaces={AllGatherAttention: AllGatherWrongOrder}),
    "cp-grads-not-sent-home": Bug(
        "ring attention backward: dK/dV are not sent the last hop back to their owner, so each "
        "rank returns its neighbour's", checks=("cp-ring",),
        replaces={RingAttention: RingGradsNotHome}),
    "cp-allgather-no-reduce-scatter": Bug(
        "all-gather attention backward: dK/dV are sliced locally instead of reduce-scattered, so "
        "each rank keeps only its own queries' contribution", checks=("cp-allgather",),
        replaces={AllGatherAttention: AllGatherNoReduceScatter}),
}
