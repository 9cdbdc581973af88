"""Autograd-aware collectives ("regions", Megatron naming) and the record of what each rank sent.

Naming (Megatron-LM ``mappings.py``): ``X_to_<region>`` enters the tensor-parallel region,
``X_from_<region>`` leaves it. Each region is a small ``torch.autograd.Function``: its forward is
one communication pattern and its backward is the transpose of it (Shoeybi et al. 2019 call the
first two ``f`` and ``g``):

    region                                      forward                    backward
    copy_to_tensor_model_parallel_region   (f)  identity                   all-reduce
    reduce_from_tensor_model_parallel_region (g) all-reduce                identity
    gather_from_tensor_model_parallel_region    all-gather along last dim  split along last dim
    scatter_to_tensor_model_parallel_region     split along last dim       all-gather along last dim

Every region takes ``group=None`` (the whole world) or a process group, so a later notebook can run
tensor parallelism inside a subgroup. With one rank in the group every region is the identity and
sends nothing (it is still recorded, with ``sent_bytes == 0``); ranks are not even needed then.

Every operation goes through ``issue()``, which performs it and notes it in the active records
(``with record() as rec:``, see :mod:`mtb_helpers.comm.records`, re-exported here). New
regions (sequence parallelism, MoE, data parallelism) call ``issue()`` too, so they are recorded
the same way.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from mtb_helpers.comm.records import (OPS, CollectiveEvent, CollectiveRecord,  # noqa: F401
                                           note, record)

def group_size(group: dist.ProcessGroup | None = None) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else 1


def group_rank(group: dist.ProcessGroup | None = None) -> int:
    return dist.get_rank(group) if dist.is_initialized() else 0


def issue(op: str, x: torch.Tensor, *, region: str, direction: str, operator: str = "",
          dim: int = -1, group: dist.ProcessGroup | None = None,
          splits: tuple[list[int], list[int]] | None = None) -> torch.Tensor:
    """Perform ``op`` on this rank's ``x`` along ``dim`` and record it (every region uses this).

    ``all_reduce``: ``x`` -> sum over ranks, same shape. ``all_gather``: ``[.., n/t]`` ->
    ``[.., n]``, shards concatenated along ``dim`` in rank order. ``reduce_scatter``:
    ``[.., n]`` -> this rank's ``[.., n/t]`` of the sum. ``split``: ``[.., n]`` -> this rank's
    ``[.., n/t]``, no communication. ``all_to_all`` (rows, ``dim`` must be 0): ``x`` ``[m, ..]``
    is cut into ``splits[0][q]`` consecutive rows for rank q; the result stacks the
    ``splits[1][q]`` rows received from each rank q in rank order, ``[sum(splits[1]), ..]``.
    Without ``splits`` every rank sends ``m/t`` rows to each rank. ``sent_bytes`` counts the rows
    sent to the other ranks.
    With one rank every op returns ``x`` unchanged (recorded with ``sent_bytes == 0``).
    """
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; expected one of {OPS}")
    t = group_size(group)
    dim = dim % x.dim()
    if op == "all_to_all":
        return _all_to_all(x, region, operator, direction, dim, group, splits, t)
    if t == 1:
        # One rank: every op is the identity and moves nothing; it is still recorded (0 bytes
        # sent), so a program's record has the same shape at every world size.
        out = x
    elif op == "all_reduce":
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
    elif op == "all_gather":
        parts = [torch.empty_like(x).contiguous() for _ in range(t)]
        dist.all_gather(parts, x.contiguous(), group=group)
        out = torch.cat(parts, dim=dim)
    elif op == "reduce_scatter":
        out = _reduce_scatter(x, dim, group, t)
    else:
        out = x.chunk(t, dim=dim)[group_rank(group)].contiguous()
    note(op, x, out, region, operator, direction, t)
    return out


def _reduce_scatter(x: torch.Tensor, dim: int, group: dist.ProcessGroup | None,
                    t: int) -> torch.Tensor:
    """``[.., n, ..]`` (``n`` at ``dim``) -> this rank's ``[.., n/t, ..]`` of the sum over the group.

    Issues the real reduce-scatter (``dist.reduce_scatter_tensor``, ``reduce_scatter_single`` in
    torch 2.13; what DTensor and FSDP2 call), so a profiler or
    ``CommDebugMode`` sees the collective the record names. gloo implements it with an all-reduce
    inside (notebook 00 measures the bytes); older gloo builds have none at all, and there the same
    result comes from an all-reduce and this rank's chunk.
    """
    n = x.shape[dim]
    if n % t:
        raise ValueError(f"reduce_scatter: dim {dim} has size {n}, not divisible by the "
                         f"{t} ranks of the group")
    full = x.movedim(dim, 0).contiguous()                        # [n, ..]: chunks are contiguous
    out = full.new_empty((n // t, *full.shape[1:]))              # [n, ..] -> reduce-scatter -> [n/t, ..]
    # torch 2.13 renamed reduce_scatter_tensor (the old name warns); Colab's older torch only has it
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    try:
        reduce_scatter(out, full, group=group)
    except RuntimeError as exc:
        if "support" not in str(exc):
            raise
        total = full.clone()                                     # full may be x itself
        dist.all_reduce(total, group=group)
        out = total.chunk(t)[group_rank(group)]
    return out.movedim(0, dim).contiguous()


def _all_to_all(x: torch.Tensor, region: str, operator: str, direction: str, dim: int,
                group: dist.ProcessGroup | None, splits: tuple[list[int], list[int]] | None,
                t: int) -> torch.Tensor:
    if dim != 0:
        raise ValueError(f"all_to_all exchanges rows (dim 0), got dim={dim}")
    if splits is None:
        if x.shape[0] % t:
            raise ValueError(f"all_to_all without splits needs {x.shape[0]} rows divisible by {t}")
        splits = ([x.shape[0] // t] * t, [x.shape[0] // t] * t)
    send, recv = [int(n) for n in splits[0]], [int(n) for n in splits[1]]
    if len(send) != t or len(recv) != t or sum(send) != x.shape[0] or min(send + recv) < 0:
        raise ValueError(f"all_to_all splits {send} / {recv} do not fit {t} ranks and "
                         f"{x.shape[0]} rows")
    row_bytes = (x.numel() // x.shape[0] if x.shape[0] else math.prod(x.shape[1:])) * x.element_size()
    me = group_rank(group)
    if t == 1:
        if recv != send:
            raise ValueError(f"all_to_all on one rank receives what it sends, got {send} / {recv}")
        out = x
    else:
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv,
                               input_split_sizes=send, group=group)
    note("all_to_all", x, out, region, operator, direction, t,
          sent=(sum(send) - send[me]) * row_bytes)
    return out


class _AllReduceGrad(torch.autograd.Function):
    """forward: identity; backward: all-reduce (sum) of the grad over the group."""

    @staticmethod
    def forward(ctx, p, region, operator, group):
        ctx.region, ctx.operator, ctx.group = region, operator, group
        return p.view_as(p)

    @staticmethod
    def backward(ctx, grad):
        return issue("all_reduce", grad, region=ctx.region, operator=ctx.operator,
                     direction="backward", group=ctx.group), None, None, None


def allreduce_grad(p: torch.Tensor, region: str, operator: str = "", group=None) -> torch.Tensor:
    """Use a replicated parameter through this when each rank saw different data (other tokens,
    other sequence rows): its grad is then summed over the group during backward. ``operator``
    names the parameter in the record (``"ln.weight"``), so its all-reduce can be told apart."""
    return _AllReduceGrad.apply(p, region, operator, group)


class _CopyToTensorModelParallelRegion(torch.autograd.Function):
    """f. forward: identity; backward: all-reduce (sum) of the input grad over the group."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return issue("all_reduce", grad, region="copy_to_tensor_model_parallel_region",
                     operator="f", direction="backward", group=ctx.group), None


class _ReduceFromTensorModelParallelRegion(torch.autograd.Function):
    """g. forward: all-reduce (sum) over the group; backward: identity."""

    @staticmethod
    def forward(ctx, x, group):
        return issue("all_reduce", x, region="reduce_from_tensor_model_parallel_region",
                     operator="g", direction="forward", group=group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromTensorModelParallelRegion(torch.autograd.Function):
    """forward: all-gather along the last dim [.., n/t] -> [.., n]; backward: split the last dim."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return issue("all_gather", x, region="gather_from_tensor_model_parallel_region",
                     direction="forward", group=group)

    @staticmethod
    def backward(ctx, grad):
        return issue("split", grad, region="gather_from_tensor_model_parallel_region",
                     direction="backward", group=ctx.group), None


class _ScatterToTensorModelParallelRegion(torch.autograd.Function):
    """forward: split the last dim [.., n] -> [.., n/t]; backward: all-gather along the last dim."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return issue("split", x, region="scatter_to_tensor_model_parallel_region",
                     direction="forward", group=group)

    @staticmethod
    def backward(ctx, grad):
        return issue("all_gather", grad, region="scatter_to_tensor_model_parallel_region",
                     direction="backward", group=ctx.group), None


def copy_to_tensor_model_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """f: forward identity, backward all-reduce. ``x`` is replicated, e.g. ``[s, b, h]``."""
    return _CopyToTensorModelParallelRegion.apply(x, group)


def reduce_from_tensor_model_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """g: forward all-reduce, backward identity. ``x`` is a partial sum of full shape ``[s, b, h]``."""
    return _ReduceFromTensorModelParallelRegion.apply(x, group)


def gather_from_tensor_model_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """forward all-gather last dim ``[.., n/t] -> [.., n]``, backward split last dim."""
    return _GatherFromTensorModelParallelRegion.apply(x, group)


def scatter_to_tensor_model_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """forward split last dim ``[.., n] -> [.., n/t]``, backward all-gather last dim."""
    return _ScatterToTensorModelParallelRegion.apply(x, group)


__all__ = ["CollectiveEvent", "CollectiveRecord", "record", "issue", "group_size", "group_rank",
           "allreduce_grad",
           "copy_to_tensor_model_parallel_region", "reduce_from_tensor_model_parallel_region",
           "gather_from_tensor_model_parallel_region", "scatter_to_tensor_model_parallel_region"]
