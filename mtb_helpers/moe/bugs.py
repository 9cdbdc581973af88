"""Deliberately wrong expert-parallel MoE layers, for ``check_moe(bug=...)``.

Like ``tp/bugs.py``: each bug is a subclass of ``ExpertParallelMoE`` whose one overridden method
differs by the bug (marked ``# BUG``).
"""
from __future__ import annotations

import torch

from mtb_helpers.checking.bug import Bug, names_for, register
from mtb_helpers.moe.layers import ExpertParallelMoE


class MoEWithoutInversePermutation(ExpertParallelMoE):
    """moe-no-inverse-permutation."""

    def unpermute(self, back: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        return back   # BUG: rows stay sorted by expert, so row i goes to the token of choice i


class MoEGateNotApplied(ExpertParallelMoE):
    """moe-gate-not-applied."""

    def weigh(self, rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return rows   # BUG: expert outputs summed unweighted; the router gets no gradient at all


class MoEWithoutRouterGradAllReduce(ExpertParallelMoE):
    """moe-no-router-grad-allreduce."""

    def router_weight(self) -> torch.Tensor:
        return self.gate.weight   # BUG: each rank keeps the router grad of its own tokens


BUGS: dict[str, Bug] = {
    "moe-no-inverse-permutation": Bug(
        'MoE combine: the rows coming back from the experts stay sorted by '
        'expert instead of going back to their tokens',
        checks=('moe',), replaces={ExpertParallelMoE: MoEWithoutInversePermutation}),
    "moe-gate-not-applied": Bug(
        'MoE combine: expert outputs are summed without the router '
        'probabilities, so the router gets no gradient',
        checks=('moe',), replaces={ExpertParallelMoE: MoEGateNotApplied}),
    "moe-no-router-grad-allreduce": Bug(
        'MoE router: its grad is not all-reduced, so each rank keeps the router '
        'grad of its own tokens',
        checks=('moe',), replaces={ExpertParallelMoE: MoEWithoutRouterGradAllReduce}),
}
MOE_BUGS = names_for(BUGS, "moe")


register("moe", BUGS)   # at import: see checking/bug.py
