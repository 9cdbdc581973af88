"""Communication regions of tensor and sequence parallelism, as Megatron-LM's ``mappings.py`` names them.

A region is one collective in forward and its transpose in backward, one ``torch.autograd.Function``
each. ``X_to_<region>`` enters a parallel region, ``X_from_<region>`` leaves it; Shoeybi et al.
(2019) call the first two ``f`` and ``g``. dim -1 is the hidden features (tensor parallelism);
dim 0 is the sequence (Megatron's ``[s, b, h]`` layout, sequence parallelism, Korthikanti et al. 2022).

    region                                       forward          backward
    copy_to_tensor_model_parallel_region    (f)  identity         all-reduce
    reduce_from_tensor_model_parallel_region (g) all-reduce       identity
    gather_from_tensor_model_parallel_region     all-gather (-1)  split (-1)
    scatter_to_tensor_model_parallel_region      split (-1)       all-gather (-1)
    scatter_to_sequence_parallel_region          split (0)        all-gather (0)
    gather_from_sequence_parallel_region         all-gather (0)   reduce-scatter (0)
    reduce_scatter_to_sequence_parallel_region   reduce-scatter   all-gather (0)
    allreduce_grad (a replicated parameter)      identity         all-reduce

Each backward is the transpose of its forward: of "copy to every rank" it is "sum from every
rank", of "all-gather" it is "reduce-scatter" (or a split when the incoming grad is already the
full sum on every rank), of "split" it is "all-gather". In DTensor's words each forward
redistributes its ``input_layouts`` to its ``output_layouts`` (g: ``Partial() -> Replicate()``).

Every region takes ``group=None`` (the whole world) or a process group and calls
``torch.distributed`` itself; ``with record() as rec:`` sees those calls from below, under the
region's name (``@recorded``). Without ``torch.distributed`` (one process) each is the identity.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from mtb_helpers.comm.mesh import group_size as _size   # ranks in the group (1 without torch.distributed)
from mtb_helpers.comm.records import local_split, recorded
from mtb_helpers.comm.sharding import Partial, Replicate, Shard

__all__ = ["allreduce_grad", "copy_to_tensor_model_parallel_region",
           "reduce_from_tensor_model_parallel_region", "gather_from_tensor_model_parallel_region",
           "scatter_to_tensor_model_parallel_region", "scatter_to_sequence_parallel_region",
           "gather_from_sequence_parallel_region", "reduce_scatter_to_sequence_parallel_region",
           "allreduce_sequence_parallel_grad", "REGIONS", "SCATTER_SP", "GATHER_SP",
           "REDUCE_SCATTER_SP", "GRAD_ALLREDUCE_SP"]

SCATTER_SP = "scatter_to_sequence_parallel_region"
GATHER_SP = "gather_from_sequence_parallel_region"
REDUCE_SCATTER_SP = "reduce_scatter_to_sequence_parallel_region"
GRAD_ALLREDUCE_SP = "allreduce_sequence_parallel_grad"
# torch 2.13 renamed these (the old names warn); Colab's older torch has only the old ones
_ALL_GATHER = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
_REDUCE_SCATTER = ("reduce_scatter_single" if hasattr(dist, "reduce_scatter_single")
                   else "reduce_scatter_tensor")


def _split(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """This rank's contiguous chunk of ``x`` along ``dim``: no communication (recorded as a split)."""
    if not dist.is_initialized():
        return x
    out = x.chunk(_size(group), dim=dim)[dist.get_rank(group)].contiguous()
    local_split(x, out, _size(group))
    return out


@recorded("copy_to_tensor_model_parallel_region", "f")
class _CopyToModelParallelRegion(torch.autograd.Function):
    """f: forward identity, backward all-reduce (dX is a partial sum on every rank)."""
    input_layouts, output_layouts = Replicate(), Replicate()   # [.., in] on every rank

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)   # [.., in] -> [.., in], a new tensor for autograd

    @staticmethod
    def backward(ctx, grad):
        if not dist.is_initialized():
            return grad, None
        grad = grad.contiguous().clone()      # this node's own copy: grad may be used elsewhere
        dist.all_reduce(grad, group=ctx.group)   # [.., in] partial dX -> sum over ranks
        return grad, None


@recorded("reduce_from_tensor_model_parallel_region", "g")
class _ReduceFromModelParallelRegion(torch.autograd.Function):
    """g: forward all-reduce of the partial sums, backward identity."""
    input_layouts, output_layouts = Partial(), Replicate()

    @staticmethod
    def forward(ctx, x, group):
        if not dist.is_initialized():
            return x.view_as(x)
        x = x.contiguous().clone()          # [.., out] partial: x itself stays this rank's addend
        dist.all_reduce(x, group=group)     # [.., out] -> sum over ranks, the same on every rank
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


@recorded("gather_from_tensor_model_parallel_region")
class _GatherFromModelParallelRegion(torch.autograd.Function):
    """forward: all-gather along the last dim; backward: split along the last dim."""
    input_layouts, output_layouts = Shard(-1), Replicate()

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        if not dist.is_initialized():
            return x.view_as(x)
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(_size(group))]
        dist.all_gather(parts, x, group=group)   # [.., out/t] from every rank, in rank order
        return torch.cat(parts, dim=-1)          # -> [.., out]

    @staticmethod
    def backward(ctx, grad):
        return _split(grad, -1, ctx.group), None   # [.., out] -> this rank's [.., out/t]


@recorded("scatter_to_tensor_model_parallel_region")
class _ScatterToModelParallelRegion(torch.autograd.Function):
    """forward: split along the last dim; backward: all-gather along the last dim."""
    input_layouts, output_layouts = Replicate(), Shard(-1)

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split(x, -1, group)   # [.., in] -> this rank's [.., in/t]

    @staticmethod
    def backward(ctx, grad):
        if not dist.is_initialized():
            return grad, None
        grad = grad.contiguous()
        parts = [torch.empty_like(grad) for _ in range(_size(ctx.group))]
        dist.all_gather(parts, grad, group=ctx.group)   # [.., in/t] -> [.., in]
        return torch.cat(parts, dim=-1), None


@recorded(SCATTER_SP)
class _ScatterToSequenceParallelRegion(torch.autograd.Function):
    """forward: split along dim 0 (the sequence); backward: all-gather along dim 0."""
    input_layouts, output_layouts = Replicate(), Shard(0)

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split(x, 0, group)   # [s, b, h] -> this rank's [s/t, b, h]

    @staticmethod
    def backward(ctx, grad):
        if not dist.is_initialized():
            return grad, None
        grad = grad.contiguous()
        out = grad.new_empty((_size(ctx.group) * grad.shape[0], *grad.shape[1:]))
        getattr(dist, _ALL_GATHER)(out, grad, group=ctx.group)   # all-gather: [s/t, b, h] -> [s, b, h]
        return out, None


@recorded(GATHER_SP)
class _GatherFromSequenceParallelRegion(torch.autograd.Function):
    """forward: all-gather along dim 0; backward: reduce-scatter along dim 0 (or a split, when
    the incoming grad is already the full sum on every rank)."""
    input_layouts, output_layouts = Shard(0), Replicate()

    @staticmethod
    def forward(ctx, x, group, tensor_parallel_output_grad):
        ctx.group, ctx.reduce = group, tensor_parallel_output_grad
        if not dist.is_initialized():
            return x.view_as(x)
        x = x.contiguous()
        out = x.new_empty((_size(group) * x.shape[0], *x.shape[1:]))
        getattr(dist, _ALL_GATHER)(out, x, group=group)   # all-gather: [s/t, b, h] -> [s, b, h]
        return out

    @staticmethod
    def backward(ctx, grad):
        if not ctx.reduce or not dist.is_initialized():
            return _split(grad, 0, ctx.group), None, None   # [s, b, h] -> [s/t, b, h]
        grad = grad.contiguous()
        out = grad.new_empty((grad.shape[0] // _size(ctx.group), *grad.shape[1:]))
        # [s, b, h] partial on every rank -> this rank's rows of the sum [s/t, b, h]
        getattr(dist, _REDUCE_SCATTER)(out, grad, group=ctx.group)   # reduce-scatter: [s, b, h] -> [s/t, b, h]
        return out, None, None


@recorded(REDUCE_SCATTER_SP)
class _ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """forward: reduce-scatter along dim 0; backward: all-gather along dim 0."""
    input_layouts, output_layouts = Partial(), Shard(0)

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        if not dist.is_initialized():
            return x.view_as(x)
        x = x.contiguous()
        out = x.new_empty((x.shape[0] // _size(group), *x.shape[1:]))
        getattr(dist, _REDUCE_SCATTER)(out, x, group=group)   # reduce-scatter: [s, b, h] partial -> [s/t, b, h]
        return out

    @staticmethod
    def backward(ctx, grad):
        if not dist.is_initialized():
            return grad, None
        grad = grad.contiguous()
        out = grad.new_empty((_size(ctx.group) * grad.shape[0], *grad.shape[1:]))
        getattr(dist, _ALL_GATHER)(out, grad, group=ctx.group)   # all-gather: [s/t, b, h] -> [s, b, h]
        return out, None


@recorded("allreduce_grad")
class _AllReduceGrad(torch.autograd.Function):
    """forward: identity on a replicated parameter; backward: all-reduce of its grad (each rank
    saw other tokens, so each holds a partial sum)."""

    @staticmethod
    def forward(ctx, param, region, operator, group):
        ctx.region, ctx.operator, ctx.group = region, operator, group   # named in the record
        return param.view_as(param)   # [..] -> [..]

    @staticmethod
    def backward(ctx, grad):
        if not dist.is_initialized():
            return grad, None, None, None
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)   # [..] partial grad -> sum over ranks
        return grad, None, None, None


def copy_to_tensor_model_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """f: ``[.., in]`` replicated; forward identity, backward all-reduce of dX."""
    return _CopyToModelParallelRegion.apply(x, group)


def reduce_from_tensor_model_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """g: ``[.., out]`` partial sums -> all-reduce -> ``[.., out]``; backward identity."""
    return _ReduceFromModelParallelRegion.apply(x, group)


def gather_from_tensor_model_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """``[.., out/t]`` -> all-gather along the last dim -> ``[.., out]``; backward splits it."""
    return _GatherFromModelParallelRegion.apply(x, group)


def scatter_to_tensor_model_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """``[.., in]`` -> this rank's ``[.., in/t]``; backward all-gathers along the last dim."""
    return _ScatterToModelParallelRegion.apply(x, group)


def scatter_to_sequence_parallel_region(x: torch.Tensor,
                                        group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``[s, b, h]`` -> this rank's ``[s/t, b, h]``; backward all-gathers along dim 0."""
    return _ScatterToSequenceParallelRegion.apply(x, group)


def gather_from_sequence_parallel_region(x: torch.Tensor, group: dist.ProcessGroup | None = None,
                                         tensor_parallel_output_grad: bool = True) -> torch.Tensor:
    """``[s/t, b, h]`` -> all-gather along dim 0 -> ``[s, b, h]``; backward reduce-scatters.

    With ``tensor_parallel_output_grad=False`` (Megatron's flag of the same name) the grad
    arriving in backward is already the full sum on every rank (e.g. a loss computed on the
    gathered output), so backward only splits it along dim 0.
    """
    return _GatherFromSequenceParallelRegion.apply(x, group, tensor_parallel_output_grad)


def reduce_scatter_to_sequence_parallel_region(x: torch.Tensor,
                                               group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``[s, b, h]`` partial sums -> reduce-scatter along dim 0 -> ``[s/t, b, h]``; backward
    all-gathers."""
    return _ReduceScatterToSequenceParallelRegion.apply(x, group)


def allreduce_grad(param: torch.Tensor, region: str, operator: str = "", group=None) -> torch.Tensor:
    """Use a replicated parameter through this when each rank saw different data (other tokens,
    other sequence rows): forward identity, backward all-reduce, so its grad is summed over the
    group. ``region`` and ``operator`` name it in the record (``"ln.weight"``)."""
    return _AllReduceGrad.apply(param, region, operator, group)


def allreduce_sequence_parallel_grad(param: torch.Tensor, name: str = "",
                                     group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``allreduce_grad`` for a parameter (e.g. LayerNorm weight ``[h]``) that sees only this
    rank's sequence rows: its grad, a partial sum over them, is summed over the group."""
    return allreduce_grad(param, GRAD_ALLREDUCE_SP, name, group)


# the regions by their public name, each declaring the placements its forward takes its input
# from and to (``input_layouts`` / ``output_layouts``, as every parallel layer does)
REGIONS: dict[str, type[torch.autograd.Function]] = {
    "copy_to_tensor_model_parallel_region": _CopyToModelParallelRegion,
    "reduce_from_tensor_model_parallel_region": _ReduceFromModelParallelRegion,
    "gather_from_tensor_model_parallel_region": _GatherFromModelParallelRegion,
    "scatter_to_tensor_model_parallel_region": _ScatterToModelParallelRegion,
    SCATTER_SP: _ScatterToSequenceParallelRegion, GATHER_SP: _GatherFromSequenceParallelRegion,
    REDUCE_SCATTER_SP: _ReduceScatterToSequenceParallelRegion}
