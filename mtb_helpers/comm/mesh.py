"""The rank mesh: named dims, a rank's coordinates, a process group per dim (or per dims
flattened into one), numbered as PyTorch's ``init_device_mesh`` numbers them.

``Mesh(pp=2, dp=2, cp=1, tp=2)`` names its dims slowest-varying first, like
``init_device_mesh("cpu", (2, 2, 1, 2), mesh_dim_names=("pp", "dp", "cp", "tp"))``:

    rank = ((pp_i * dp + dp_i) * cp + cp_i) * tp + tp_i

which is also Megatron-LM's order (``tp-cp-dp-pp``): tensor-parallel ranks are neighbours because
they talk inside every layer, the pipeline the least (Narayanan et al., SC 2021). A group of dim
``d`` holds the ranks that differ only in their ``d`` coordinate; a flattened group of dims
``("dp", "cp")`` those that differ only in those two (``mesh["dp", "cp"]._flatten()`` in PyTorch).
tests/test_mesh.py shows the groups equal to ``init_device_mesh``'s on real ranks.

``MeshGroups.build(mesh, keep=True)`` keeps the groups in the rank process between calls (each
``dist.new_group`` waits for every rank through the store, ~100 ms a call on a loaded machine): at
most ``KEEP_MESHES`` meshes, the least recently used destroyed first, at the same point on every
rank; a new default group drops them all.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import product

import torch
import torch.distributed as dist

from mtb_helpers.runtime.link import unmodelled
from mtb_helpers.runtime.link_ops import ORIG

__all__ = ["Mesh", "MeshGroups", "KEEP_MESHES", "kept_meshes", "group_size", "group_rank", "agree"]


def group_size(group: dist.ProcessGroup | None = None) -> int:
    """Ranks in ``group`` (1 without torch.distributed: one process)."""
    return dist.get_world_size(group) if dist.is_initialized() else 1


def group_rank(group: dist.ProcessGroup | None = None) -> int:
    """This rank's index in ``group`` (0 without torch.distributed)."""
    return dist.get_rank(group) if dist.is_initialized() else 0


def agree(mine: torch.Tensor, group: dist.ProcessGroup | None = None) -> list[torch.Tensor]:
    """Every rank's ``mine`` (same shape and dtype on every rank), in group-rank order: an
    all-gather for a check the ranks make together (do we all hold shards of one shape?), not
    part of the step's traffic, so neither recorded nor given an emulated link's time."""
    everyone = [torch.empty_like(mine) for _ in range(group_size(group))]
    with unmodelled():   # torch's own function: outside the link's model and every record
        ORIG["all_gather"](everyone, mine, group=group)
    return everyone


KEEP_MESHES = 4   # meshes whose groups a rank keeps: ~16 groups each at 4 ranks, ~30 at 8
# In a rank process only (the owner never initialises a process group): the default group the
# kept groups were made in, and (names, shape, flatten) -> the MeshGroups that owns them.
_kept: OrderedDict = OrderedDict()
_kept_in: list = [None]


class Mesh:
    """Named dims and their sizes, slowest first: ``Mesh(dp=2, tp=2)``. Pure arithmetic: no rank,
    no process group (``MeshGroups.build`` makes those, inside the ranks)."""

    def __init__(self, **sizes: int):
        if not sizes:
            raise ValueError("a mesh needs at least one dim, e.g. Mesh(tp=2)")
        for name, n in sizes.items():
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"mesh dim {name} must be a positive integer, got {n!r}")
        self.names: tuple[str, ...] = tuple(sizes)
        self.shape: tuple[int, ...] = tuple(sizes.values())
        self.sizes: dict[str, int] = dict(sizes)
        self.size = math.prod(self.shape)

    def __repr__(self) -> str:
        return "Mesh(" + ", ".join(f"{d}={n}" for d, n in self.sizes.items()) + ")"

    def __eq__(self, other) -> bool:
        return isinstance(other, Mesh) and self.sizes == other.sizes and self.names == other.names

    def _check_dims(self, dims) -> None:
        unknown = [d for d in dims if d not in self.sizes]
        if unknown or len(set(dims)) != len(dims):
            raise ValueError(f"dims {tuple(dims)} must be distinct dims of {self!r}")

    def coords(self, rank: int) -> dict[str, int]:
        """``{dim: index}`` of ``rank``, in the mesh's dim order."""
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} is not on {self!r} ({self.size} ranks)")
        out = {}
        for name, n in reversed(self.sizes.items()):   # the last dim varies fastest
            rank, out[name] = divmod(rank, n)
        return {d: out[d] for d in self.names}

    def rank_of(self, **index: int) -> int:
        """The rank at ``index`` (a dim left out is at 0): ``Mesh(dp=2, tp=2).rank_of(dp=1) == 2``."""
        self._check_dims(tuple(index))
        rank = 0
        for name, n in self.sizes.items():
            i = index.get(name, 0)
            if not 0 <= i < n:
                raise ValueError(f"index {name}={i} is outside mesh dim {name} of size {n}")
            rank = rank * n + i
        return rank

    def group_ranks(self, *dims: str) -> list[list[int]]:
        """Every group along ``dims`` (several dims: flattened into one group), each in rank order,
        the groups ordered by the other dims' coordinates (slowest first)."""
        self._check_dims(dims)
        others = [d for d in self.names if d not in dims]
        groups = []
        for fixed in product(*(range(self.sizes[d]) for d in others)):
            base = dict(zip(others, fixed))
            ranks = [self.rank_of(**base, **dict(zip(dims, v)))
                     for v in product(*(range(self.sizes[d]) for d in dims))]
            groups.append(sorted(ranks))
        return groups

    def group_of(self, rank: int, *dims: str) -> list[int]:
        """The ranks of ``rank``'s group along ``dims``."""
        return next(g for g in self.group_ranks(*dims) if rank in g)


@dataclass
class MeshGroups:
    """This rank's place on a mesh and a process group per dim (and per flattened dims, named
    ``"dp_cp"`` for ``("dp", "cp")`` as ``DeviceMesh._flatten`` names it). Build inside a rank."""
    mesh: Mesh
    rank: int
    index: dict[str, int]
    groups: dict = field(default_factory=dict)           # name -> this rank's process group
    members: dict[str, list[int]] = field(default_factory=dict)   # name -> its ranks
    created: list = field(default_factory=list)          # every group made, to free them after

    @classmethod
    def build(cls, mesh: Mesh, flatten: tuple[tuple[str, ...], ...] = (), keep: bool = False,
              **extra) -> "MeshGroups":
        """Create every group of every dim, then of every flattened tuple of dims, in the same order
        on every rank (``dist.new_group`` is collective: a rank skipping a group it is not in would
        hang the others). Without an initialised process group: rank 0, no groups (one process).
        ``keep``: reuse the groups an earlier call on this rank made for the same mesh and
        ``flatten`` (see the module's docstring); ``destroy()`` then leaves them alive."""
        on = dist.is_initialized()
        if on and dist.get_world_size() != mesh.size:
            raise ValueError(f"{mesh!r} has {mesh.size} ranks but the world has "
                             f"{dist.get_world_size()}")
        flatten = tuple(tuple(f) for f in flatten)
        if keep and on:
            owner = _kept_groups(mesh, flatten)
            return cls(mesh, owner.rank, dict(owner.index), dict(owner.groups),
                       dict(owner.members), [], **extra)   # created: none, the keeper frees them
        rank = dist.get_rank() if on else 0
        out = cls(mesh, rank, mesh.coords(rank), **extra)
        for dims in [(d,) for d in mesh.names] + list(flatten):
            name = "_".join(dims)
            for ranks in mesh.group_ranks(*dims):
                group = dist.new_group(ranks) if on else None
                out.created.append(group)
                if rank in ranks:
                    out.groups[name], out.members[name] = group, ranks
        return out

    def destroy(self) -> None:
        """Free the groups (the rank pool is reused: every run would otherwise leak some)."""
        for group in self.created:
            if group is not None and group != dist.GroupMember.NON_GROUP_MEMBER:
                dist.destroy_process_group(group)
        self.created.clear()


def _kept_groups(mesh: Mesh, flatten: tuple[tuple[str, ...], ...]) -> MeshGroups:
    """This rank's kept groups of ``mesh``, made now if no earlier call made them in the current
    default group; the least recently used mesh beyond ``KEEP_MESHES`` is destroyed."""
    world = dist.group.WORLD
    if _kept_in[0] is not world:   # made in a default group since destroyed: they went with it
        _kept.clear()
        _kept_in[0] = world
    key = (mesh.names, mesh.shape, flatten)
    owner = _kept.pop(key, None) or MeshGroups.build(mesh, flatten)
    _kept[key] = owner
    while len(_kept) > KEEP_MESHES:
        _kept.popitem(last=False)[1].destroy()
    return owner


def kept_meshes() -> list[tuple]:
    """``(names, shape, flatten)`` of the meshes whose groups this rank keeps, oldest first."""
    return list(_kept) if _kept_in[0] is dist.group.WORLD else []
