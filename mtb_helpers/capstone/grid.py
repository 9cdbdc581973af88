"""The 4D rank grid: tensor (tp) x context (cp) x data (dp) x pipeline (pp) parallel groups.

``comm.mesh``'s ``Mesh(pp=pp, dp=dp, cp=cp, tp=tp)`` (``GridLayout.mesh()``): Megatron-LM's order,
tensor-parallel ranks neighbours, the pipeline (which talks least) slowest,

    rank = ((pp_i * dp + dp_i) * cp + cp_i) * tp + tp_i

A parameter's gradient is averaged over every rank holding the same shard of it and seeing other
tokens: the data-parallel **and** the context-parallel ranks, the flattened ``dp_cp`` group
(Megatron's data-parallel group "with context parallelism").
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
    """This rank's coordinates and process groups, one per dim and the flattened ``dp_cp`` (build
    inside a rank). Kept in the rank between calls (``MeshGroups.build(keep=True)``)."""
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
