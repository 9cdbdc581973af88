"""The course against PyTorch's own API on the same ranks: one ``Agreement`` per comparison.

Every topic's ``pytorch.py`` runs its lesson twice on each rank, once with the course's layer (its
collectives in a ``comm.record``) and once with PyTorch's API (its collectives counted by
``torch.distributed.tensor.debug.CommDebugMode``), and returns per rank
``{"torch": {q: tensor}, "course": {q: tensor}, "counts": {direction: (torch, course)}}``;
``agreement`` folds those into an ``Agreement``: the float64 error per quantity next to the
tolerance of the course's checks, and the collectives each side issued.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mtb_helpers.checking.tolerances import tolerance
from mtb_helpers.comm.records import CollectiveRecord

__all__ = ["Agreement", "agreement", "torch_counts", "course_counts", "local", "max_errors",
           "one_dim_mesh"]

_OPS = {"allreduce_": "all_reduce", "all_reduce": "all_reduce", "_allgather_base_": "all_gather",
        "all_gather_into_tensor": "all_gather", "allgather_": "all_gather",
        "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
        "reduce_scatter_": "reduce_scatter", "all_to_all_single": "all_to_all",
        "alltoall_base_": "all_to_all", "broadcast_": "broadcast", "broadcast": "broadcast"}


def torch_counts(mode) -> dict[str, int]:
    """A ``CommDebugMode``'s counts with the course's op names: ``{"all_reduce": 1}``."""
    out: dict[str, int] = {}
    for op, n in mode.get_comm_counts().items():
        name = str(getattr(op, "__name__", op)).split(".")[-1]
        key = _OPS.get(name, name)
        out[key] = out.get(key, 0) + n
    return out


def course_counts(rec: CollectiveRecord, direction: str) -> dict[str, int]:
    """What the course's record holds for ``direction``, local splits and one-rank groups left
    out (the course records those with 0 bytes sent; PyTorch issues nothing there)."""
    out: dict[str, int] = {}
    for e in rec.communicating():
        if e.direction == direction and e.group_size > 1:
            out[e.op] = out.get(e.op, 0) + 1
    return out


def local(x: torch.Tensor | None) -> torch.Tensor | None:
    """This rank's piece: a DTensor's local shard (a Partial one unreduced), a tensor as it is."""
    if x is None:
        return None
    return (x.to_local() if hasattr(x, "to_local") else x).detach().clone()


def full_grad(name: str, grad) -> torch.Tensor | None:
    """Parameter ``name``'s grad as the full sum: a Partial DTensor is reduced by
    ``.full_tensor()`` (an all-reduce); anything else is read as it is (``local``)."""
    from torch.distributed.tensor import DTensor, Partial   # when a comparison runs, not at import
    if isinstance(grad, DTensor) and any(isinstance(p, Partial) for p in grad.placements):
        return grad.full_tensor().detach().clone()
    return local(grad)


@dataclass
class Agreement:
    """PyTorch's API against the course's layer on the same ranks, as plain data.

    ``errors[q]``: max over ranks of ``max|PyTorch - course|`` (float64); ``tolerances[q]``: the
    float64 tolerance of the course's checks at that quantity's scale; ``counts[direction]``:
    ``(PyTorch's counts, the course's counts)``, ``{op: n}`` per rank (rank 0's; ``notes`` say
    where ranks differ); ``mapping``: (course name, PyTorch name) pairs.
    """
    lesson: str
    world_size: int
    mapping: list[tuple[str, str]]
    errors: dict[str, float]
    tolerances: dict[str, float]
    counts: dict[str, tuple[dict[str, int], dict[str, int]]]
    notes: list[str] = field(default_factory=list)
    bug: str | None = None
    sources: tuple[str, str] = ("PyTorch (CommDebugMode)", "course (record)")

    @property
    def agree(self) -> bool:
        return all(self.errors[q] <= self.tolerances[q] for q in self.errors)

    def disagreeing(self) -> set[str]:
        return {q for q in self.errors if not self.errors[q] <= self.tolerances[q]}

    def _head(self) -> list[str]:
        head = [f"{self.lesson} on {self.world_size} ranks, float64"
                + (f" (bug: {self.bug})" if self.bug else "")]
        head += [f"  course {c:<44} -> PyTorch {p}" for c, p in self.mapping]
        return head

    def _count_lines(self) -> list[str]:
        def text(c: dict[str, int]) -> str:
            return ", ".join(f"{n} {op}" for op, n in sorted(c.items())) or "nothing"
        lines = [f"  {'collectives per rank':<22}{self.sources[0]:<34}{self.sources[1]}"]
        lines += [f"  {d:<22}{text(p):<34}{text(c)}" for d, (p, c) in self.counts.items()]
        return lines + [f"  note: {n}" for n in self.notes]

    def __str__(self) -> str:
        lines = self._head() + [f"  {'quantity':<22}{'max|PyTorch - course|':>22}"
                                f"{'tolerance':>12}  agree"]
        lines += [f"  {q:<22}{e:>22.1e}{self.tolerances[q]:>12.1e}  "
                  f"{'yes' if e <= self.tolerances[q] else 'NO'}" for q, e in self.errors.items()]
        return "\n".join(lines + self._count_lines())

    def summary(self) -> str:
        """Verdicts, error bounds and counts: prints the same on any BLAS and thread count (the
        errors as a fixed bound far below the tolerance, not their last bits)."""
        ok = [q for q in self.errors if q not in self.disagreeing()]
        lines = self._head()
        lines.append(f"  agree within the float64 tolerance: {', '.join(ok) or 'nothing'}")
        if ok:
            tol = min((self.tolerances[q] for q in ok if self.tolerances[q] > 0), default=0.0)
            bound = "< 1e-13" if all(self.errors[q] < 1e-13 for q in ok) else "<= tolerance"
            lines.append(f"    max|PyTorch - course| {bound} on each (tolerance {tol:.0e} or more)")
        if self.disagreeing():
            lines.append(f"  DISAGREE: {', '.join(sorted(self.disagreeing()))}")
        return "\n".join(lines + self._count_lines())


def max_errors(results: list[dict]) -> tuple[dict[str, float], dict[str, float]]:
    """Per quantity: max over ranks of ``max|torch - course|`` and the float64 tolerance at the
    course's scale; a missing piece or a shape mismatch counts as an infinite error."""
    errors: dict[str, float] = {}
    tols: dict[str, float] = {}
    for res in results:
        for q, ours in res["course"].items():
            theirs = res["torch"].get(q)
            if theirs is None or tuple(theirs.shape) != tuple(ours.shape):
                err = float("inf")
            else:
                err = float((theirs.double() - ours.double()).abs().max()) if ours.numel() else 0.0
            errors[q] = max(errors.get(q, 0.0), err)
            tols[q] = max(tols.get(q, 0.0), tolerance(ours.double(), torch.float64))
    return errors, tols


def agreement(lesson: str, results: list[dict], mapping: list[tuple[str, str]],
              bug: str | None = None, notes: tuple[str, ...] = ()) -> Agreement:
    """Fold every rank's ``{"torch", "course", "counts"}`` into one ``Agreement``."""
    errors, tols = max_errors(results)
    notes = list(notes)
    if any(r["counts"] != results[0]["counts"] for r in results):
        notes.append("ranks issued different counts; rank 0's are shown")
    return Agreement(lesson, len(results), mapping, errors, tols, results[0]["counts"], notes,
                     bug)


def one_dim_mesh():
    """A ``DeviceMesh`` over every rank of the default gloo group (CPU)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    return DeviceMesh("cpu", list(range(dist.get_world_size())))
