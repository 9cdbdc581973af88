"""The 4D rank grid: tensor (tp) x context (cp) x data (dp) x pipeline (pp) parallel groups.

Ranks are numbered the way Megatron-LM orders its groups (``tp-cp-dp-pp``): tensor-parallel ranks
are neighbours (they talk inside every layer), then context, then data, then pipeline (which talks
least, one activation per micro-batch and stage):

    rank = ((pp_i * dp + dp_i) * cp + cp_i) * tp + tp_i

A group of one dimension holds the ranks that differ only in that coordinate. Gradients of a
parameter are averaged over every rank holding the same shard of it and seeing different tokens:
that is the data-parallel **and** the context-parallel ranks, so the gradient reduction runs in
the ``dp x cp`` group (Megatron calls it the data-parallel group "with context parallelism").
The numbering, the groups and the flattened ``dp_cp`` group are ``comm.mesh``'s
``Mesh(pp=pp, dp=dp, cp=cp, tp=tp)`` (``GridLayout.mesh()``), PyTorch's ``init_device_mesh`` with the
same dims: a rank's coordinates are ``layout.mesh().coords(rank)``, the rank at a cell
``layout.mesh().rank_of(pp=.., tp=..)``.
"""
from __future__ import annotations

from dataclasses import dataclass

from mtb_helpers.comm.mesh import Mesh, MeshGroups

__all__ = ["DIMS", "GridLayout", "group_ranks", "Grid"]

DIMS = ("tp", "cp", "dp", "pp")   # fastest-varying first


@dataclass(frozen=True)
class GridLayout:
    """The sizes of the capstone's 4D rank grid (the planner's ``plan.specs.Layout`` adds what a
    real run also chooses: micro-batches, ZeRO stage, recomputation, dtype)."""
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def sizes(self) -> dict[str, int]:
        return {d: getattr(self, d) for d in DIMS}

    def mesh(self) -> Mesh:
        """The rank mesh, slowest dim first: ``init_device_mesh``'s ``(pp, dp, cp, tp)``."""
        return Mesh(pp=self.pp, dp=self.dp, cp=self.cp, tp=self.tp)

    def __str__(self) -> str:
        return f"tp={self.tp} pp={self.pp} dp={self.dp} cp={self.cp}"


def group_ranks(layout: GridLayout, dims: tuple[str, ...]) -> list[list[int]]:
    """Every group varying ``dims`` (the other coordinates fixed), each in rank order."""
    return layout.mesh().group_ranks(*dims)


@dataclass
class Grid(MeshGroups):
    """This rank's coordinates and its process groups: one per dim and the flattened ``dp_cp``
    (call inside a rank; every rank creates every group, in the same order). The groups are kept
    in the rank between calls (``MeshGroups.build(keep=True)``): an explorer moving back to a
    layout, or the next call of a long run, does not create its ~16 groups again; ``destroy()``
    leaves them to the keeper."""
    layout: GridLayout | None = None

    @classmethod
    def build(cls, layout: GridLayout) -> "Grid":
        return super().build(layout.mesh(), flatten=(("dp", "cp"),), keep=True, layout=layout)

    def tensor_group(self):
        return self.groups["tp"]

    def context_group(self):
        return self.groups["cp"]

    def pipeline_ranks(self) -> list[int]:
        """Global ranks of this rank's pipeline, stage 0 first."""
        return self.members["pp"]

    def gradient_group(self):
        """Where a parameter's gradient is averaged: the ranks with the same shard of it that
        saw other tokens (other batch rows: dp; other sequence chunks: cp)."""
        return self.groups["dp_cp"]
