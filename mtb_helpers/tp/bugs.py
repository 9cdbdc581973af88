"""Deliberately wrong tensor-parallel layers, for the checks' ``bug=`` argument.

Each bug is a subclass of a correct layer from ``tp/layers.py`` whose ``forward`` differs by the one
bug (marked ``# BUG``; see checking/bug.py); ``from_full`` is a classmethod, so the subclass shards
the full layer exactly like the correct one. The last two bugs set PyTorch up wrongly in the
comparison of ``tp/pytorch.py`` (a ``TensorParallelPlan`` with one placement wrong).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mtb_helpers.checking.bug import Bug, Setting, names_for, register, swap
from mtb_helpers.comm.records import recorded
from mtb_helpers.comm.regions import (_CopyToModelParallelRegion, _GatherFromModelParallelRegion,
                                      _ReduceFromModelParallelRegion,
                                      copy_to_tensor_model_parallel_region,
                                      gather_from_tensor_model_parallel_region,
                                      reduce_from_tensor_model_parallel_region,
                                      scatter_to_tensor_model_parallel_region)
from mtb_helpers.tp.layers import (ColumnParallelLinear, ParallelMLP, RowParallelLinear,
                                   TensorParallelPlan)


@recorded("copy_to_tensor_model_parallel_region", "f")
class _CopyWithoutAllReduce(_CopyToModelParallelRegion):
    """f with the wrong backward: identity instead of the all-reduce of dX."""

    @staticmethod
    def backward(ctx, grad):
        return grad, None   # BUG: no all-reduce, each rank keeps only its partial dX


class ColumnWithoutF(ColumnParallelLinear):
    """f-backward-identity."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _CopyWithoutAllReduce.apply(x, self.group)   # BUG: f whose backward never all-reduces dX
        y = F.linear(x, self.weight, self.bias)
        if self.gather_output:
            y = gather_from_tensor_model_parallel_region(y, self.group)
        return y


@recorded("gather_from_tensor_model_parallel_region")
class _GatherReversed(_GatherFromModelParallelRegion):
    """forward: all-gather along the last dim, concatenated in reverse rank order (wrong);
    backward: split along the last dim in rank order (right)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x, group=group)   # [.., out/t] from every rank, in rank order
        return torch.cat(parts[::-1], dim=-1)    # BUG: concatenated in reverse rank order


class ColumnGatherWrongOrder(ColumnParallelLinear):
    """allgather-wrong-order."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to_tensor_model_parallel_region(x, self.group)
        y = F.linear(x, self.weight, self.bias)
        if self.gather_output:
            y = _GatherReversed.apply(y, self.group)   # BUG: shards land in the wrong columns
        return y


class RowBiasBeforeAllReduce(RowParallelLinear):
    """bias-before-allreduce."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = scatter_to_tensor_model_parallel_region(x, self.group)
        partial = F.linear(x, self.weight, self.bias)   # BUG: every rank adds bias, the sum has t x bias
        return reduce_from_tensor_model_parallel_region(partial, self.group)


class RowWithoutAllReduce(RowParallelLinear):
    """row-missing-allreduce."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = scatter_to_tensor_model_parallel_region(x, self.group)
        y = F.linear(x, self.weight)   # BUG: the partial products are never summed (no g)
        return y + self.bias if self.bias is not None else y


@recorded("reduce_from_tensor_model_parallel_region", "g")
class _ReduceBothWays(_ReduceFromModelParallelRegion):
    """g with the wrong backward: all-reduce (right in forward; g's backward is the identity)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _ReduceFromModelParallelRegion.forward(ctx, x, group)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)   # BUG: every grad before g becomes t times too large
        return grad, None


class RowGBackwardAllReduce(RowParallelLinear):
    """g-backward-allreduce."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = scatter_to_tensor_model_parallel_region(x, self.group)
        y = _ReduceBothWays.apply(F.linear(x, self.weight), self.group)
        return y + self.bias if self.bias is not None else y


class InputAsPartial(TensorParallelPlan):
    """input-as-partial."""

    def column(self):
        from torch.distributed.tensor import Partial
        from torch.distributed.tensor.parallel import ColwiseParallel
        # BUG: the replicated X declared Partial(): DTensor sums the ranks' copies, t·X goes in
        return ColwiseParallel(input_layouts=Partial())


class RowOutputPartial(TensorParallelPlan):
    """row-output-partial."""

    def row(self):
        from torch.distributed.tensor import Partial
        from torch.distributed.tensor.parallel import RowwiseParallel
        return RowwiseParallel(output_layouts=Partial())   # BUG: left Partial, no all-reduce


BUGS: dict[str, Bug] = {
    "f-backward-identity": Bug(
        'column layer: identity instead of f, so dX is never all-reduced in '
        'backward (each rank keeps only its partial input grad)',
        checks=('column', 'mlp'), replaces={ColumnParallelLinear: ColumnWithoutF}),
    "allgather-wrong-order": Bug(
        'column layer with gather_output: the gathered shards are concatenated '
        'in reverse rank order',
        checks=('column',), replaces={ColumnParallelLinear: ColumnGatherWrongOrder},
        needs={"gather_output=True (without it there is no all-gather to get wrong)":
               Setting("gather_output", True)}),
    "bias-before-allreduce": Bug(
        'row layer: every rank adds the full bias before the all-reduce, so the '
        'output carries t x bias',
        checks=('row', 'mlp'), replaces={RowParallelLinear: RowBiasBeforeAllReduce}),
    "row-missing-allreduce": Bug(
        'row layer: no all-reduce (g) after the partial products, so each rank '
        'returns only its partial sum',
        checks=('row', 'mlp'), replaces={RowParallelLinear: RowWithoutAllReduce}),
    "g-backward-allreduce": Bug(
        'row layer: g also all-reduces in backward, so every grad computed '
        'before it is t times too large',
        checks=('row', 'mlp'), replaces={RowParallelLinear: RowGBackwardAllReduce}),
    "input-as-partial": Bug(
        "PyTorch's column layer: the replicated X declared Partial(), so DTensor all-reduces it "
        "and t·X goes in", checks=("pytorch_column", "pytorch_mlp"),
        replaces={TensorParallelPlan: InputAsPartial}),
    "row-output-partial": Bug(
        "PyTorch's row layer: the output left Partial(), so nothing all-reduces the partial sums",
        checks=("pytorch_row", "pytorch_mlp"), replaces={TensorParallelPlan: RowOutputPartial}),
}
COLUMN_BUGS = names_for(BUGS, "column")
ROW_BUGS = names_for(BUGS, "row")
MLP_BUGS = names_for(BUGS, "mlp")


def build_mlp(fc1, fc2, bug: Bug | None = None, group=None) -> ParallelMLP:
    """``ParallelMLP.from_full(fc1, fc2)`` with ``bug`` injected into the sub-layer it concerns."""
    return ParallelMLP(swap(bug, ColumnParallelLinear).from_full(fc1, gather_output=False, group=group),
                       swap(bug, RowParallelLinear).from_full(fc2, input_is_parallel=True, group=group))


register("tp", BUGS)   # at import: see checking/bug.py
