"""The 4D rank grid: tensor (tp) x context (cp) x data (dp) x pipeline (pp) parallel groups.

Ranks are numbered the way Megatron-LM orders its groups (``tp-cp-dp-pp``): tensor-parallel ranks
are neighbours (they talk inside every layer), then context, then data, then pipeline (which talks
least, one activation per micro-batch and stage):

    rank = ((pp_i * dp + dp_i) * cp + cp_i) * tp + tp_i

A group of one dimension holds the ranks that differ only in that coordinate. Gradients of a
parameter are averaged over every rank holding the same shard of it and seeing different tokens:
that is the data-parallel **and** the context-parallel ranks, so the gradient reduction runs in
the ``dp x cp`` group (Megatron calls it the data-parallel group "with context parallelism").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product

import torch.distributed as dist

__all__ = ["DIMS", "Layout", "coords", "rank_of", "group_ranks", "Grid"]

DIMS = ("tp", "cp", "dp", "pp")   # fastest-varying first


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def sizes(self) -> dict[str, int]:
        return {d: getattr(self, d) for d in DIMS}

    def __str__(self) -> str:
        return f"tp={self.tp} pp={self.pp} dp={self.dp} cp={self.cp}"


def coords(rank: int, layout: Layout) -> dict[str, int]:
    """``{"tp": tp_i, "cp": cp_i, "dp": dp_i, "pp": pp_i}`` of ``rank``."""
    out = {}
    for d in DIMS:
        rank, out[d] = divmod(rank, getattr(layout, d))
    return out


def rank_of(layout: Layout, **index: int) -> int:
    rank = 0
    for d in reversed(DIMS):
        rank = rank * getattr(layout, d) + index.get(d, 0)
    return rank


def group_ranks(layout: Layout, dims: tuple[str, ...]) -> list[list[int]]:
    """Every group varying ``dims`` (the other coordinates fixed), each in rank order."""
    fixed = [d for d in DIMS if d not in dims]
    groups = []
    for values in product(*(range(getattr(layout, d)) for d in fixed)):
        base = dict(zip(fixed, values))
        ranks = sorted(rank_of(layout, **base, **dict(zip(dims, v)))
                       for v in product(*(range(getattr(layout, d)) for d in dims)))
        groups.append(ranks)
    return groups


GROUPS = {"tp": ("tp",), "cp": ("cp",), "dp": ("dp",), "pp": ("pp",), "dp_cp": ("dp", "cp")}


@dataclass
class Grid:
    """This rank's coordinates and its process groups (call inside a rank; every rank creates
    every group, in the same order, as ``dist.new_group`` requires)."""
    layout: Layout
    rank: int
    index: dict[str, int] = field(default_factory=dict)
    groups: dict = field(default_factory=dict)
    members: dict[str, list[int]] = field(default_factory=dict)
    created: list = field(default_factory=list)   # every group made, to free them after the run

    @classmethod
    def build(cls, layout: Layout) -> "Grid":
        rank = dist.get_rank() if dist.is_initialized() else 0
        grid = cls(layout, rank, coords(rank, layout))
        for name, dims in GROUPS.items():
            for ranks in group_ranks(layout, dims):
                group = dist.new_group(ranks) if dist.is_initialized() else None
                grid.created.append(group)
                if rank in ranks:
                    grid.groups[name], grid.members[name] = group, ranks
        return grid

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

    def destroy(self) -> None:
        """Free the groups (the rank pool is reused: every run would otherwise leak some)."""
        for group in self.created:
            if group is not None and group != dist.GroupMember.NON_GROUP_MEMBER:
                dist.destroy_process_group(group)
