"""Deliberately wrong pieces of the 4D run, for ``check_capstone(bug=...)``.

Each is a subclass of a correct piece overriding one method (marked ``# BUG``); ``train_on_rank``
builds whatever ``Bug.replaces`` puts in place of ``Grid``, ``ParallelEmbedding`` or
``SequenceParallelGrads``.
"""
from __future__ import annotations

import torch

from mtb_helpers.capstone.finalize import SequenceParallelGrads
from mtb_helpers.capstone.grid import Grid
from mtb_helpers.capstone.layers import ParallelEmbedding
from mtb_helpers.checking.bug import Bug, register

__all__ = ["BUGS", "CAPSTONE_BUGS", "GradientsInTensorGroup", "GradientsWithoutContext",
           "LocalPositions", "SequenceParallelGradsLeftPartial"]


class GradientsInTensorGroup(Grid):
    """capstone-dp-allreduce-in-tp-group."""

    def gradient_group(self):
        return self.groups["tp"]   # BUG: sums different shards, never the replicas' grads


class GradientsWithoutContext(Grid):
    """capstone-grads-not-averaged-over-cp."""

    def gradient_group(self):
        return self.groups["dp"]   # BUG: each context rank keeps the grad of its own chunk


class LocalPositions(ParallelEmbedding):
    """capstone-cp-local-positions."""

    def positions(self, n: int) -> torch.Tensor:
        return self.pos[:n]        # BUG: every context chunk thinks it starts at position 0


class SequenceParallelGradsLeftPartial(SequenceParallelGrads):
    """capstone-sp-grads-not-reduced."""

    def finalize(self) -> None:
        return None                # BUG: each copy keeps the grad of its own sequence rows only


BUGS: dict[str, Bug] = {
    "capstone-dp-allreduce-in-tp-group": Bug(
        "capstone: the gradient all-reduce runs in the tensor-parallel group instead of the "
        "dp x cp group, so replicas never combine their grads and TP shards are summed together",
        ("capstone",), {Grid: GradientsInTensorGroup}),
    "capstone-grads-not-averaged-over-cp": Bug(
        "capstone: gradients are averaged over dp only, forgetting the context-parallel ranks, "
        "so each sequence chunk steps with its own gradient (wrong whenever cp > 1)",
        ("capstone",), {Grid: GradientsWithoutContext}),
    "capstone-cp-local-positions": Bug(
        "capstone: each context-parallel rank adds the positions 0..s/cp-1 instead of its "
        "chunk's global positions (wrong whenever cp > 1)",
        ("capstone",), {ParallelEmbedding: LocalPositions}),
    "capstone-sp-grads-not-reduced": Bug(
        "capstone: under sequence parallelism the LayerNorm and bias grads are never summed over "
        "the tensor group, so each tensor rank steps its copy with the grad of its own sequence "
        "rows and the copies drift apart (wrong whenever tp > 1 with sequence parallelism)",
        ("capstone",), {SequenceParallelGrads: SequenceParallelGradsLeftPartial}),
}
CAPSTONE_BUGS = tuple(BUGS)

register("capstone", BUGS)   # at import: see checking/bug.py
