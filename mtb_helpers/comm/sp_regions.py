"""Sequence-parallel regions (Korthikanti et al. 2022): collectives along the sequence dim 0.

Megatron's layout is sequence first, ``[s, b, h]``; under sequence parallelism rank r holds the
rows ``s*r/t .. s*(r+1)/t`` of the sequence, ``[s/t, b, h]``. Between the LayerNorm/dropout part of
a block (sharded by sequence) and the tensor-parallel matmuls (sharded by hidden columns) the
activation changes hands with these regions; each backward is the transpose of its forward:

    region                                          forward                     backward
    scatter_to_sequence_parallel_region             split along dim 0           all-gather along dim 0
    gather_from_sequence_parallel_region            all-gather along dim 0      reduce-scatter along dim 0
    reduce_scatter_to_sequence_parallel_region      reduce-scatter along dim 0  all-gather along dim 0
    allreduce_sequence_parallel_grad                identity                    all-reduce (sum)

The last one wraps a *parameter* that is replicated on every rank but only sees this rank's
tokens (LayerNorm weight and bias, the row-parallel bias): its local grad is a partial sum over
the sequence, so the grad is all-reduced on its way back. It is ``f`` applied to a parameter.

All four go through ``comm.issue``, so ``with comm.record()`` records them like the TP regions.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from mtb_helpers.comm.regions import allreduce_grad, issue

SCATTER_SP = "scatter_to_sequence_parallel_region"
GATHER_SP = "gather_from_sequence_parallel_region"
REDUCE_SCATTER_SP = "reduce_scatter_to_sequence_parallel_region"
GRAD_ALLREDUCE_SP = "allreduce_sequence_parallel_grad"

__all__ = ["scatter_to_sequence_parallel_region", "gather_from_sequence_parallel_region",
           "reduce_scatter_to_sequence_parallel_region", "allreduce_sequence_parallel_grad",
           "SCATTER_SP", "GATHER_SP", "REDUCE_SCATTER_SP", "GRAD_ALLREDUCE_SP"]


class _ScatterToSequenceParallelRegion(torch.autograd.Function):
    """forward: split along dim 0 [s, ..] -> [s/t, ..]; backward: all-gather along dim 0."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return issue("split", x, region=SCATTER_SP, direction="forward", dim=0, group=group)

    @staticmethod
    def backward(ctx, grad):
        return issue("all_gather", grad, region=SCATTER_SP, direction="backward", dim=0,
                     group=ctx.group), None


class _GatherFromSequenceParallelRegion(torch.autograd.Function):
    """forward: all-gather along dim 0 [s/t, ..] -> [s, ..]; backward: reduce-scatter along dim 0
    (or split along dim 0 when the grad is already the full sum on every rank)."""

    @staticmethod
    def forward(ctx, x, group, grad_is_partial):
        ctx.group, ctx.grad_is_partial = group, grad_is_partial
        return issue("all_gather", x, region=GATHER_SP, direction="forward", dim=0, group=group)

    @staticmethod
    def backward(ctx, grad):
        op = "reduce_scatter" if ctx.grad_is_partial else "split"
        return issue(op, grad, region=GATHER_SP, direction="backward", dim=0,
                     group=ctx.group), None, None


class _ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """forward: reduce-scatter along dim 0 [s, ..] -> [s/t, ..]; backward: all-gather along dim 0."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return issue("reduce_scatter", x, region=REDUCE_SCATTER_SP, direction="forward", dim=0,
                     group=group)

    @staticmethod
    def backward(ctx, grad):
        return issue("all_gather", grad, region=REDUCE_SCATTER_SP, direction="backward", dim=0,
                     group=ctx.group), None


def scatter_to_sequence_parallel_region(x: torch.Tensor,
                                        group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """forward split dim 0 ``[s, b, h] -> [s/t, b, h]``, backward all-gather dim 0."""
    return _ScatterToSequenceParallelRegion.apply(x, group)


def gather_from_sequence_parallel_region(x: torch.Tensor, group: dist.ProcessGroup | None = None,
                                         tensor_parallel_output_grad: bool = True) -> torch.Tensor:
    """forward all-gather dim 0 ``[s/t, b, h] -> [s, b, h]``, backward reduce-scatter dim 0.

    With ``tensor_parallel_output_grad=False`` (Megatron's flag of the same name) the grad
    arriving in backward is already the full sum on every rank (e.g. a loss computed on the
    gathered output), so backward only splits it along dim 0.
    """
    return _GatherFromSequenceParallelRegion.apply(x, group, tensor_parallel_output_grad)


def reduce_scatter_to_sequence_parallel_region(x: torch.Tensor,
                                               group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """forward reduce-scatter dim 0 ``[s, b, h] -> [s/t, b, h]``, backward all-gather dim 0.
    ``x`` is this rank's partial sum of the full sequence."""
    return _ReduceScatterToSequenceParallelRegion.apply(x, group)


def allreduce_sequence_parallel_grad(p: torch.Tensor, name: str = "",
                                     group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """forward identity, backward all-reduce: use ``p`` (e.g. LayerNorm weight ``[h]``) through
    this so its grad, a partial sum over this rank's tokens, is summed over the group."""
    return allreduce_grad(p, GRAD_ALLREDUCE_SP, name, group)
