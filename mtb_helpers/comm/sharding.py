"""Layouts in PyTorch's own words: who holds which piece of a tensor, and the refusal when it does not divide.

Every parallel layer of the course states the layout of what it takes and returns as
``input_layouts`` / ``output_layouts``, with DTensor's placements (``torch.distributed.tensor``),
the vocabulary of ``parallelize_module``:

    Replicate()   every rank holds the whole tensor
    Shard(d)      dim ``d`` is cut into ``t`` equal contiguous pieces in rank order:
                  rank ``r`` holds ``[r*n/t, (r+1)*n/t)`` (``shard_range``)
    Partial()     every rank holds a full-shape addend; the true tensor is their sum

A layer in one process group (a 1-D mesh) declares one placement, or, as PyTorch's
``PrepareModuleInput`` does, a plain tuple with one placement per forward argument. A layer on
several mesh dims declares one placement per mesh dim, named: ``on_mesh(cp=Shard(0), tp=Shard(-1))``
is a tuple ``(Shard(0), Shard(-1))`` (what ``DTensor.from_local(x, mesh, placements)`` takes
for a mesh with ``mesh_dim_names=("cp", "tp")``) that also knows the names of its dims. Pieces
nest left to right, as in ``distribute_tensor``: ``on_mesh(cp=Shard(0), tp=Shard(0))`` gives rank
``(c, j)`` piece ``j`` of piece ``c`` of dim 0. Every check feeds a layer its declared input with
``local_piece`` and reads its declared output with ``from_pieces``.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch.distributed.tensor import Partial, Placement, Replicate, Shard

__all__ = ["check_divisible", "shard_range", "Replicate", "Shard", "Partial", "MeshPlacements",
           "on_mesh", "local_piece", "from_pieces", "name", "describe"]


def check_divisible(what: str, size: int, world_size: int) -> None:
    """Raise ValueError unless ``world_size`` divides dimension ``what`` of size ``size``."""
    if size % world_size:
        raise ValueError(f"{what}={size} is not divisible by the world size {world_size}: "
                         f"tensor parallelism splits it into {world_size} equal shards")


def shard_range(size: int, world_size: int, rank: int) -> tuple[int, int]:
    """``(start, stop)`` of rank ``rank``'s contiguous shard of a dimension of size ``size``."""
    step = size // world_size
    return rank * step, (rank + 1) * step


class MeshPlacements(tuple):
    """One placement per mesh dim, slowest-varying dim first (``init_device_mesh``'s order), with
    the dims' names in ``.dims``. It is a plain tuple of placements to DTensor."""
    dims: tuple[str, ...]

    def __new__(cls, dims: Sequence[str], placements: Sequence[Placement]) -> "MeshPlacements":
        if len(dims) != len(placements) or len(set(dims)) != len(dims):
            raise ValueError(f"one placement per distinct mesh dim, got dims {tuple(dims)} and "
                             f"{len(placements)} placements")
        for p in placements:
            if not isinstance(p, Placement):
                raise ValueError(f"not a placement: {p!r} (use Replicate(), Shard(dim), Partial())")
        self = super().__new__(cls, placements)
        self.dims = tuple(dims)
        return self

    def __repr__(self) -> str:
        return "on_mesh(" + ", ".join(f"{d}={name(p)}" for d, p in zip(self.dims, self)) + ")"

    def __reduce__(self):   # pickled to ranks and back with its names
        return (MeshPlacements, (self.dims, tuple(self)))


def on_mesh(**placements: Placement) -> MeshPlacements:
    """``on_mesh(cp=Shard(0), tp=Shard(-1))``: the layout on a mesh with dims ``("cp", "tp")``."""
    return MeshPlacements(tuple(placements), tuple(placements.values()))


def _per_dim(placements, coords, sizes) -> list[tuple[Placement, int, int]]:
    """``[(placement, index, size)]`` per mesh dim, in the layout's order; ValueError on a mismatch."""
    if isinstance(placements, Placement):
        if not isinstance(coords, int) or not isinstance(sizes, int):
            raise ValueError(f"a 1-D layout {placements} needs an int rank and world size, got "
                             f"coords={coords!r}, sizes={sizes!r}")
        out = [(placements, coords, sizes)]
    elif isinstance(placements, MeshPlacements) and isinstance(coords, Mapping):
        if set(coords) != set(placements.dims) or set(sizes) != set(placements.dims):
            raise ValueError(f"coords {dict(coords)} and sizes {dict(sizes)} must name exactly the "
                             f"mesh dims of {placements!r}")
        out = [(p, coords[d], sizes[d]) for d, p in zip(placements.dims, placements)]
    elif isinstance(placements, tuple) and all(isinstance(p, Placement) for p in placements):
        if len(coords) != len(placements) or len(sizes) != len(placements):
            raise ValueError(f"{len(placements)} placements need as many coords and sizes, got "
                             f"{coords!r}, {sizes!r}")
        out = list(zip(placements, coords, sizes))
    else:
        raise ValueError(f"layout must be a placement (Replicate(), Shard(d), Partial()) or one per "
                         f"mesh dim, got {placements!r}")
    for p, i, n in out:
        if not 0 <= i < n:
            raise ValueError(f"coordinate {i} is outside a mesh dim of size {n}")
    return out


def local_piece(full: torch.Tensor, placements, coords, sizes) -> torch.Tensor:
    """The piece of ``full`` that the rank at ``coords`` holds under ``placements``.

    1-D: ``local_piece(x, Shard(-1), rank, world_size)``. Several mesh dims:
    ``local_piece(x, on_mesh(cp=Shard(0), tp=Shard(-1)), {"cp": 1, "tp": 0}, {"cp": 2, "tp": 2})``
    (or tuples in mesh-dim order). ``Partial()`` holds ``full / n`` on each of the ``n`` ranks,
    as ``distribute_tensor`` does, so that the sum is the whole. A shard is a view (no copy).
    """
    piece = full
    for p, i, n in _per_dim(placements, coords, sizes):
        if isinstance(p, Shard):
            dim = p.dim % full.dim()
            check_divisible(f"dim {dim} (size {piece.shape[dim]}) of a {list(full.shape)} tensor",
                            piece.shape[dim], n)
            lo, hi = shard_range(piece.shape[dim], n, i)
            piece = piece.narrow(dim, lo, hi - lo)
        elif isinstance(p, Partial):
            if p.reduce_op != "sum":
                raise ValueError(f"only Partial('sum') has a piece to cut, got {p}")
            piece = piece / n
        elif not isinstance(p, Replicate):
            raise ValueError(f"no local piece for placement {p!r}")
    return piece


def from_pieces(pieces: Mapping, placements, sizes) -> torch.Tensor:
    """The full tensor from every rank's piece: ``pieces[coords]`` (an int rank for a 1-D layout,
    else a tuple of coordinates in the layout's dim order). Shards are concatenated in order,
    partial addends summed and replicas must agree (ValueError naming the first that does not)."""
    dims = _per_dim(placements, *_first(placements, sizes))
    shape = [n for _, _, n in dims]

    def merge(level: int, prefix: tuple) -> torch.Tensor:
        if level == len(dims):
            return pieces[prefix[0] if isinstance(placements, Placement) else prefix]
        p, _, n = dims[level]
        parts = [merge(level + 1, prefix + (i,)) for i in range(n)]
        if isinstance(p, Shard):
            return torch.cat(parts, dim=p.dim % parts[0].dim())
        if isinstance(p, Partial):
            return torch.stack(parts).sum(0)
        for i, part in enumerate(parts[1:], 1):
            if not torch.equal(part, parts[0]):
                raise ValueError(f"replicas differ: coordinate {i} of mesh dim {level} holds "
                                 f"another tensor than coordinate 0 under {p}")
        return parts[0]

    if len(pieces) != math.prod(shape):
        raise ValueError(f"expected {math.prod(shape)} pieces, got {len(pieces)}")
    return merge(0, ())


def _first(placements, sizes):
    """Coordinates 0 on every dim, and the sizes, in the form ``_per_dim`` reads."""
    if isinstance(placements, Placement):
        return 0, sizes
    if isinstance(placements, MeshPlacements) and isinstance(sizes, Mapping):
        return {d: 0 for d in placements.dims}, sizes
    return tuple(0 for _ in placements), tuple(sizes)


def name(p: Placement) -> str:
    """A placement as the code that makes it: ``Shard(-1)``, ``Replicate()``, ``Partial()``
    (DTensor's own ``str`` is the terse ``S(-1)``, ``R``, ``P(sum)``)."""
    if isinstance(p, Shard):
        return f"Shard({p.dim})"
    if isinstance(p, Partial):
        return "Partial()" if p.reduce_op == "sum" else f"Partial({p.reduce_op!r})"
    return f"{type(p).__name__}()"


def describe(placements) -> str:
    """A layout as text for tables and prints: ``Shard(-1)``, ``(Shard(-1), Replicate())`` (one
    per argument), ``cp=Shard(0) tp=Replicate()`` (one per mesh dim)."""
    if isinstance(placements, MeshPlacements):
        return " ".join(f"{d}={name(p)}" for d, p in zip(placements.dims, placements))
    if isinstance(placements, tuple):
        return "(" + ", ".join(name(p) for p in placements) + ")"
    return name(placements)
