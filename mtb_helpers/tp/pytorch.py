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

The mapping (course -> PyTorch) is ``_MAP`` (printed with the result) and the placements of
``TensorParallelPlan`` (``tp/layers.py``); f's backward all-reduce of dX is DTensor turning the
``Partial`` grad of a ``Replicate`` input back into ``Replicate``. ``bug=`` names a wrong plan from
``tp/bugs.py`` (one placement wrong): the result must then disagree.
"""
from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

from mtb_helpers.checking.agreement import (Agreement, agreement, course_counts, local, one_dim_mesh,
                                            torch_counts)
from mtb_helpers.checking.bug import Bug, resolve, swap
from mtb_helpers.comm.records import record
from mtb_helpers.comm.sharding import Shard, check_divisible, local_piece
from mtb_helpers.runtime.ranks import resolve_world_size, run
from mtb_helpers.tp.layers import (ColumnParallelLinear, ParallelMLP, RowParallelLinear,
                                   TensorParallelPlan)
from mtb_helpers.tp.reference import draw_inputs

__all__ = ["pytorch_column", "pytorch_row", "pytorch_mlp", "tp_on_rank", "course_run", "torch_run"]


def course_run(layer: nn.Module, x: torch.Tensor, dy: torch.Tensor):
    """``(output, input grad, record of its collectives)`` of the course's ``layer``."""
    x = x.clone().requires_grad_(True)
    with record() as rec:
        y = layer(x)
        y.backward(dy)
    return y.detach(), x.grad, rec


def torch_run(layer: nn.Module, x: torch.Tensor, dy: torch.Tensor):
    """``(output's local piece, input grad, {direction: collective counts})`` of a module
    ``parallelize_module`` made, counted by ``CommDebugMode``."""
    from torch.distributed.tensor.debug import CommDebugMode
    x = x.clone().requires_grad_(True)
    with CommDebugMode() as fwd:
        y = layer(x)
    with CommDebugMode() as bwd:
        y.backward(dy)
    return local(y), x.grad, {"forward": torch_counts(fwd), "backward": torch_counts(bwd)}


def tp_on_rank(kind: str, layers: list[nn.Linear], x: torch.Tensor, dy: torch.Tensor,
               bug: Bug | None = None) -> dict:
    """Run on every rank: the course's layer and ``parallelize_module`` on the same full layers.

    ``x`` ``[.., in]`` and ``dy`` ``[.., out]`` are the full tensors; a row layer gets this rank's
    columns of ``x`` ``[.., in/t]``, a column layer this rank's columns of ``dy`` ``[.., out/t]``.
    Returns ``{"torch": {q: tensor}, "course": {q: tensor},
    "counts": {direction: (torch, course)}}`` with the pieces this rank holds.
    """
    import torch.distributed as dist
    from torch.distributed.tensor.parallel import parallelize_module
    t, r = dist.get_world_size(), dist.get_rank()
    if kind == "row":       # this rank's input columns [.., in/t]
        x = local_piece(x, Shard(-1), r, t)
    if kind == "column":    # the grad of this rank's output columns [.., out/t]
        dy = local_piece(dy, Shard(-1), r, t)
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
        parallelize_module(theirs, one_dim_mesh(), swap(bug, TensorParallelPlan)().plan(kind))
        got = dict(zip(("output", "input_grad", "counts"), torch_run(theirs, x, dy)))
    out, dx, rec = course_run(course, x, dy)
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
    "column": [("ColumnParallelLinear (W_r = rows of weight)", "ColwiseParallel: weight Shard(0)"),
               ("X replicated, f = copy (bwd all-reduce)", "input Replicate(); dX Partial -> Replicate"),
               ("Y_r = X W_r, [.., out/t]", "output Shard(-1), .to_local()")],
    "row": [("RowParallelLinear (W_r = columns of weight)", "RowwiseParallel: weight Shard(1)"),
            ("X_r, [.., in/t]", "input Shard(-1)"),
            ("partial sums X_r W_r, + bias once after g", "Partial(); each rank adds bias/t"),
            ("g = all-reduce, Y on every rank", "Partial -> Replicate()")],
    "mlp": [("ParallelMLP: fc1 column, GeLU, fc2 row", "parallelize_module(mlp, mesh, plan)"),
            ("fc1 = ColumnParallelLinear", 'plan["0"] = ColwiseParallel()'),
            ("fc2 = RowParallelLinear", 'plan["2"] = RowwiseParallel()')],
}


def _compare(kind: str, lesson: str, world_size: int, in_features: int, out_features: int,
             ffn_hidden: int, batch_shape: tuple[int, ...], seed: int, bug: str | None,
             timeout: float) -> Agreement:
    t = resolve_world_size(world_size)
    wrong = resolve(bug, f"pytorch_{kind}")
    name, size = {"column": ("out_features", out_features), "row": ("in_features", in_features),
                  "mlp": ("ffn_hidden", ffn_hidden)}[kind]
    check_divisible(f"{lesson}: {name}", size, t)
    shapes = [(in_features, ffn_hidden), (ffn_hidden, in_features)] if kind == "mlp" else [
        (in_features, out_features)]
    layers, x, dy = draw_inputs(seed, tuple(batch_shape), torch.float64, *shapes)
    results = run(tp_on_rank, kind, layers, x, dy, wrong, world_size=t, timeout=timeout)
    return agreement(lesson, results, _MAP[kind], bug)


def pytorch_column(world_size: int = 2, in_features: int = 8, out_features: int = 12,
                   batch_shape: tuple[int, ...] = (2, 3), seed: int = 0,
                   bug: str | None = None, timeout: float = 60.0) -> Agreement:
    """``ColwiseParallel`` vs ``ColumnParallelLinear``: output ``[.., out/t]``, dX, dW_r, dbias_r."""
    return _compare("column", "column parallel", world_size, in_features, out_features, 0,
                    batch_shape, seed, bug, timeout)


def pytorch_row(world_size: int = 2, in_features: int = 12, out_features: int = 8,
                batch_shape: tuple[int, ...] = (2, 3), seed: int = 0,
                bug: str | None = None, timeout: float = 60.0) -> Agreement:
    """``RowwiseParallel`` vs ``RowParallelLinear``: output ``[.., out]``, dX_r, dW_r, dbias."""
    return _compare("row", "row parallel", world_size, in_features, out_features, 0,
                    batch_shape, seed, bug, timeout)


def pytorch_mlp(world_size: int = 2, hidden: int = 8, ffn_hidden: int = 12,
                batch_shape: tuple[int, ...] = (2, 3), seed: int = 0,
                bug: str | None = None, timeout: float = 60.0) -> Agreement:
    """``parallelize_module`` with Colwise fc1 and Rowwise fc2 vs ``ParallelMLP``."""
    return _compare("mlp", "tensor-parallel MLP", world_size, hidden, hidden, ffn_hidden,
                    batch_shape, seed, bug, timeout)
