"""Deliberately wrong expert-parallel MoE layers, for ``check_moe(bug=...)``.

Like ``tp_bugs.py`` / ``sp_bugs.py``: each bug is a subclass of ``ExpertParallelMoE`` whose one
overridden method differs by the mistake (marked ``# BUG``), so a notebook can show it with
``inspect.getsource`` and the correct layer carries no test-only code path.
"""
from __future__ import annotations

import torch
from torch import nn

from mtb_helpers.moe.layers import Expert, ExpertParallelMoE

MOE_BUGS = ("moe-no-inverse-permutation", "moe-gate-not-applied", "moe-no-router-grad-allreduce")


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


_CLASSES = {"moe-no-inverse-permutation": MoEWithoutInversePermutation,
            "moe-gate-not-applied": MoEGateNotApplied,
            "moe-no-router-grad-allreduce": MoEWithoutRouterGradAllReduce}


def build_moe(gate: nn.Linear, experts: list[Expert], top_k: int = 1,
              capacity_factor: float | None = None, bug: str | None = None,
              group=None) -> ExpertParallelMoE:
    """``ExpertParallelMoE.from_full(...)``, or the class with ``bug`` in it."""
    return _CLASSES.get(bug, ExpertParallelMoE).from_full(gate, experts, top_k, capacity_factor,
                                                          group)
