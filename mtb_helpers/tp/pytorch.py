"""Notebooks 01-03 in PyTorch's own API: DTensor tensor parallelism against the course's layers.

    res = pytorch_column(world_size=2)      # ColwiseParallel vs ColumnParallelLinear
    res = pytorch_row(world_size=3)         # RowwiseParallel vs RowParallelLinear
    res = pytorch_mlp(world_size=2)         # {"fc1": Colwise, "fc2": Rowwise} vs ParallelMLP
    print(res)              # max |PyTorch - course| per quantity, in float64, next to a tolerance
    print(res.summary())    # the verdicts and the collectives each side issued (no raw floats)

On every rank the same full ``nn.Linear`` goes twice through one forward and backward: once cut
by the course's layer (the ``comm.record`` of its collectives) and once by
``torch.distributed.tensor.parallel.parallelize_module`` on a one-dimensional ``DeviceMesh``
(the collectives counted by ``torch.distributed.tensor.debug.CommDebugMode``). Both see the same
X and dY; each rank compares what it holds (a DTensor parameter's grad through ``.to_local()``).

The mapping (course -> PyTorch): ``ColumnParallelLinear`` -> ``ColwiseParallel`` (weight
``Shard(0)`` of nn.Linear's ``[out, in]``, input ``Replicate``, output ``Shard(-1)``);
``RowParallelLinear`` -> ``RowwiseParallel`` (weight ``Shard(1)``, input ``Shard(-1)``, the
matmul gives a ``Partial`` sum, output ``Replicate``: the all-reduce ``g``); f's backward
all-reduce of dX is DTensor turning the ``Partial`` grad of a ``Replicate`` input back into
``Replicate``. ``mistake=`` swaps one placement for a wrong one (``TP_MISTAKES``): the result must
then disagree. The shared pieces (``Agreement``, the count helpers) serve sp, pp, dp and grid too.
"""
from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field

import torch
from torch import nn

from mtb_helpers.checking.tolerances import tolerance
from mtb_helpers.comm.records import CollectiveRecord, record
from mtb_helpers.comm.sharding import check_divisible, shard_range
from mtb_helpers.runtime.ranks import resolve_world_size, run
from mtb_helpers.tp.layers import ColumnParallelLinear, ParallelMLP, RowParallelLinear
from mtb_helpers.tp.reference import draw_inputs

__all__ = ["Agreement", "pytorch_column", "pytorch_row", "pytorch_mlp", "tp_on_rank",
           "TP_MISTAKES", "torch_counts", "course_counts", "local", "max_errors", "agreement"]

# Wrong placements: each must make PyTorch disagree with the course (tests prove it).
TP_MISTAKES = {"input-as-partial": "column: the replicated X declared Partial(): DTensor "
                                    "all-reduces it, t·X goes in",
               "row-output-partial": "row/mlp: the output left Partial(): no all-reduce"}
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
    mistake: str | None = None
    sources: tuple[str, str] = ("PyTorch (CommDebugMode)", "course (record)")

    @property
    def agree(self) -> bool:
        return all(self.errors[q] <= self.tolerances[q] for q in self.errors)

    def disagreeing(self) -> set[str]:
        return {q for q in self.errors if not self.errors[q] <= self.tolerances[q]}

    def _head(self) -> list[str]:
        head = [f"{self.lesson} on {self.world_size} ranks, float64"
                + (f" (mistake: {self.mistake})" if self.mistake else "")]
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
              mistake: str | None = None, notes: tuple[str, ...] = ()) -> Agreement:
    """Fold every rank's ``{"torch", "course", "counts"}`` into one ``Agreement``."""
    errors, tols = max_errors(results)
    notes = list(notes)
    if any(r["counts"] != results[0]["counts"] for r in results):
        notes.append("ranks issued different counts; rank 0's are shown")
    return Agreement(lesson, len(results), mapping, errors, tols, results[0]["counts"], notes,
                     mistake)


def one_dim_mesh():
    """A ``DeviceMesh`` over every rank of the default gloo group (CPU)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    return DeviceMesh("cpu", list(range(dist.get_world_size())))


def _course_run(layer: nn.Module, x: torch.Tensor, dy: torch.Tensor):
    x = x.clone().requires_grad_(True)
    with record() as rec:
        y = layer(x)
        y.backward(dy)
    return y.detach(), x.grad, rec


def _torch_run(layer: nn.Module, x: torch.Tensor, dy: torch.Tensor):
    from torch.distributed.tensor.debug import CommDebugMode
    x = x.clone().requires_grad_(True)
    with CommDebugMode() as fwd:
        y = layer(x)
    with CommDebugMode() as bwd:
        y.backward(dy)
    return local(y), x.grad, {"forward": torch_counts(fwd), "backward": torch_counts(bwd)}


def _plan(kind: str, mistake: str | None):
    from torch.distributed.tensor import Partial
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    col = (ColwiseParallel(input_layouts=Partial()) if mistake == "input-as-partial"
           else ColwiseParallel())
    row = (RowwiseParallel(output_layouts=Partial()) if mistake == "row-output-partial"
           else RowwiseParallel())
    return {"column": col, "row": row, "mlp": {"0": col, "2": row}}[kind]


def tp_on_rank(kind: str, layers: list[nn.Linear], x: torch.Tensor, dy: torch.Tensor,
               mistake: str | None = None) -> dict:
    """Run on every rank: the course's layer and ``parallelize_module`` on the same full layers.

    ``x`` ``[.., in]`` and ``dy`` ``[.., out]`` are the full tensors; a row layer gets this rank's
    columns of ``x`` ``[.., in/t]``, a column layer this rank's columns of ``dy`` ``[.., out/t]``. Returns ``{"torch": {q: tensor}, "course": {q: tensor},
    "counts": {direction: (torch, course)}}`` with the pieces this rank holds.
    """
    import torch.distributed as dist
    from torch.distributed.tensor.parallel import parallelize_module
    t, r = dist.get_world_size(), dist.get_rank()
    if kind == "row":       # this rank's input columns [.., in/t]
        lo, hi = shard_range(x.shape[-1], t, r)
        x = x[..., lo:hi]
    if kind == "column":    # the grad of this rank's output columns [.., out/t]
        lo, hi = shard_range(dy.shape[-1], t, r)
        dy = dy[..., lo:hi]
    if kind == "mlp":
        course = ParallelMLP.from_full(*layers)
        theirs = nn.Sequential(copy.deepcopy(layers[0]), nn.GELU(), copy.deepcopy(layers[1]))
        names = {"fc1": (course.fc1, theirs[0]), "fc2": (course.fc2, theirs[2])}
    else:
        cls = ColumnParallelLinear if kind == "column" else RowParallelLinear
        course, theirs = cls.from_full(layers[0]), copy.deepcopy(layers[0])
        names = {"": (course, theirs)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallelize_module(theirs, one_dim_mesh(), _plan(kind, mistake))
        got = dict(zip(("output", "input_grad", "counts"), _torch_run(theirs, x, dy)))
    out, dx, rec = _course_run(course, x, dy)
    pieces = {"torch": {"output": got["output"], "input_grad": got["input_grad"]},
              "course": {"output": out, "input_grad": dx}}
    for prefix, (ours, other) in names.items():
        for p in ("weight", "bias"):
            q = f"{prefix}.{p}_grad" if prefix else f"{p}_grad"
            pieces["course"][q] = local(getattr(ours, p).grad)
            pieces["torch"][q] = local(getattr(other, p).grad)
    counts = {d: (got["counts"][d], course_counts(rec, d)) for d in ("forward", "backward")}
    return {**pieces, "counts": counts}


_MAP = {
    "column": [("ColumnParallelLinear (W_i = rows of weight)", "ColwiseParallel: weight Shard(0)"),
               ("X replicated, f = copy (bwd all-reduce)", "input Replicate(); dX Partial -> Replicate"),
               ("Y_i = X W_i, [.., out/t]", "output Shard(-1), .to_local()")],
    "row": [("RowParallelLinear (W_i = columns of weight)", "RowwiseParallel: weight Shard(1)"),
            ("X_i, [.., in/t]", "input Shard(-1)"),
            ("partial sums X_i W_i, + b once after g", "Partial(); each rank adds b/t"),
            ("g = all-reduce, Y on every rank", "Partial -> Replicate()")],
    "mlp": [("ParallelMLP: fc1 column, GeLU, fc2 row", "parallelize_module(mlp, mesh, plan)"),
            ("fc1 = ColumnParallelLinear", 'plan["0"] = ColwiseParallel()'),
            ("fc2 = RowParallelLinear", 'plan["2"] = RowwiseParallel()')],
}


def _compare(kind: str, lesson: str, world_size: int, in_features: int, out_features: int,
             ffn_hidden: int, batch_shape: tuple[int, ...], seed: int, mistake: str | None,
             timeout: float) -> Agreement:
    t = resolve_world_size(world_size)
    if mistake is not None and mistake not in TP_MISTAKES:
        raise ValueError(f"unknown mistake {mistake!r}; expected one of {sorted(TP_MISTAKES)}")
    name, size = {"column": ("out_features", out_features), "row": ("in_features", in_features),
                  "mlp": ("ffn_hidden", ffn_hidden)}[kind]
    check_divisible(f"{lesson}: {name}", size, t)
    shapes = [(in_features, ffn_hidden), (ffn_hidden, in_features)] if kind == "mlp" else [
        (in_features, out_features)]
    layers, x, dy = draw_inputs(seed, tuple(batch_shape), torch.float64, *shapes)
    results = run(tp_on_rank, kind, layers, x, dy, mistake, world_size=t, timeout=timeout)
    return agreement(lesson, results, _MAP[kind], mistake)


def pytorch_column(world_size: int = 2, in_features: int = 8, out_features: int = 12,
                   batch_shape: tuple[int, ...] = (2, 3), seed: int = 0,
                   mistake: str | None = None, timeout: float = 60.0) -> Agreement:
    """``ColwiseParallel`` vs ``ColumnParallelLinear``: output ``[.., out/t]``, dX, dW_i, db_i."""
    return _compare("column", "column parallel", world_size, in_features, out_features, 0,
                    batch_shape, seed, mistake, timeout)


def pytorch_row(world_size: int = 2, in_features: int = 12, out_features: int = 8,
                batch_shape: tuple[int, ...] = (2, 3), seed: int = 0,
                mistake: str | None = None, timeout: float = 60.0) -> Agreement:
    """``RowwiseParallel`` vs ``RowParallelLinear``: output ``[.., out]``, dX_i, dW_i, db."""
    return _compare("row", "row parallel", world_size, in_features, out_features, 0,
                    batch_shape, seed, mistake, timeout)


def pytorch_mlp(world_size: int = 2, hidden: int = 8, ffn_hidden: int = 12,
                batch_shape: tuple[int, ...] = (2, 3), seed: int = 0,
                mistake: str | None = None, timeout: float = 60.0) -> Agreement:
    """``parallelize_module`` with Colwise fc1 and Rowwise fc2 vs ``ParallelMLP``."""
    return _compare("mlp", "tensor-parallel MLP", world_size, hidden, hidden, ffn_hidden,
                    batch_shape, seed, mistake, timeout)
