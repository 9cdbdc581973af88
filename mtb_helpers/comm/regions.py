"""Autograd regions (Megatron-LM's ``mappings.py`` names), tensor- and sequence-parallel alike.

A region is one collective in forward and its transpose in backward. ``X_to_<region>`` enters a
parallel region, ``X_from_<region>`` leaves it; Shoeybi et al. (2019) call the first two ``f``
and ``g``. The whole family is one table, ``REGIONS``: each row says what forward does, what
backward does, and along which dim (-1: the hidden features, tensor parallelism; 0: the sequence,
Megatron's ``[s, b, h]`` layout, sequence parallelism, Korthikanti et al. 2022). One
``torch.autograd.Function``, ``_Region``, performs any row; the public functions below name them.

    region                                      forward          backward         dim
    copy_to_tensor_model_parallel_region   (f)  identity         all-reduce       -1
    reduce_from_tensor_model_parallel_region (g) all-reduce      identity         -1
    gather_from_tensor_model_parallel_region    all-gather       split            -1
    scatter_to_tensor_model_parallel_region     split            all-gather       -1
    scatter_to_sequence_parallel_region         split            all-gather        0
    gather_from_sequence_parallel_region        all-gather       reduce-scatter    0
    reduce_scatter_to_sequence_parallel_region  reduce-scatter   all-gather        0
    allreduce_grad (a parameter, e.g. ln.weight) identity        all-reduce        -

Read down a column pair and each backward is the transpose of its forward: the transpose of
"copy to every rank" is "sum from every rank", of "all-gather" is "reduce-scatter" (or a plain
split when the incoming grad is already the full sum on every rank), of "split" is "all-gather".

In DTensor's words each forward is a redistribution from ``input_layouts`` to ``output_layouts``
(``x.redistribute(mesh, [output_layouts])``): g is ``Partial() -> Replicate()``, the sequence
gather ``Shard(0) -> Replicate()``, the reduce-scatter ``Partial() -> Shard(0)``.

Every region takes ``group=None`` (the whole world) or a process group, and performs its
collectives through ``issue()``, so ``with record() as rec:`` records them.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

from mtb_helpers.comm.issue import issue
from mtb_helpers.comm.sharding import Partial, Placement, Replicate, Shard

__all__ = ["Region", "REGIONS", "allreduce_grad",
           "copy_to_tensor_model_parallel_region", "reduce_from_tensor_model_parallel_region",
           "gather_from_tensor_model_parallel_region", "scatter_to_tensor_model_parallel_region",
           "scatter_to_sequence_parallel_region", "gather_from_sequence_parallel_region",
           "reduce_scatter_to_sequence_parallel_region", "allreduce_sequence_parallel_grad",
           "SCATTER_SP", "GATHER_SP", "REDUCE_SCATTER_SP", "GRAD_ALLREDUCE_SP"]


class Region(NamedTuple):
    """One row of the table: ``forward`` and ``backward`` are ops of ``issue()`` or
    ``"identity"``; ``operator`` is the paper's name (``f``, ``g``) or what the row carries;
    the forward takes ``input_layouts`` to ``output_layouts``."""
    name: str
    forward: str
    backward: str
    dim: int
    operator: str = ""
    input_layouts: Placement = Replicate()
    output_layouts: Placement = Replicate()


SCATTER_SP = "scatter_to_sequence_parallel_region"
GATHER_SP = "gather_from_sequence_parallel_region"
REDUCE_SCATTER_SP = "reduce_scatter_to_sequence_parallel_region"
GRAD_ALLREDUCE_SP = "allreduce_sequence_parallel_grad"

REGIONS: dict[str, Region] = {r.name: r for r in (
    Region("copy_to_tensor_model_parallel_region", "identity", "all_reduce", -1, "f",
           Replicate(), Replicate()),
    Region("reduce_from_tensor_model_parallel_region", "all_reduce", "identity", -1, "g",
           Partial(), Replicate()),
    Region("gather_from_tensor_model_parallel_region", "all_gather", "split", -1, "",
           Shard(-1), Replicate()),
    Region("scatter_to_tensor_model_parallel_region", "split", "all_gather", -1, "",
           Replicate(), Shard(-1)),
    Region(SCATTER_SP, "split", "all_gather", 0, "", Replicate(), Shard(0)),
    Region(GATHER_SP, "all_gather", "reduce_scatter", 0, "", Shard(0), Replicate()),
    Region(REDUCE_SCATTER_SP, "reduce_scatter", "all_gather", 0, "", Partial(), Shard(0)),
)}


def _perform(op: str, x: torch.Tensor, region: Region, direction: str, group) -> torch.Tensor:
    if op == "identity":
        return x.view_as(x) if direction == "forward" else x   # a view: autograd sees a new tensor
    return issue(op, x, region=region.name, operator=region.operator, direction=direction,
                 dim=region.dim, group=group)


class _Region(torch.autograd.Function):
    """forward: ``region.forward`` on ``x``; backward: ``region.backward`` on the grad (the
    transpose of forward), both along ``region.dim`` within ``group``."""

    @staticmethod
    def forward(ctx, x, region: Region, group):
        ctx.region, ctx.group = region, group
        return _perform(region.forward, x, region, "forward", group)

    @staticmethod
    def backward(ctx, grad):
        return _perform(ctx.region.backward, grad, ctx.region, "backward", ctx.group), None, None


def copy_to_tensor_model_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """f: ``[.., h]`` replicated; forward identity, backward all-reduce of dX."""
    return _Region.apply(x, REGIONS["copy_to_tensor_model_parallel_region"], group)


def reduce_from_tensor_model_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """g: ``[.., h]`` partial sums -> all-reduce -> ``[.., h]``; backward identity."""
    return _Region.apply(x, REGIONS["reduce_from_tensor_model_parallel_region"], group)


def gather_from_tensor_model_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """``[.., n/t]`` -> all-gather along the last dim -> ``[.., n]``; backward splits it."""
    return _Region.apply(x, REGIONS["gather_from_tensor_model_parallel_region"], group)


def scatter_to_tensor_model_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """``[.., n]`` -> this rank's ``[.., n/t]``; backward all-gathers along the last dim."""
    return _Region.apply(x, REGIONS["scatter_to_tensor_model_parallel_region"], group)


def scatter_to_sequence_parallel_region(x: torch.Tensor,
                                        group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``[s, b, h]`` -> this rank's ``[s/t, b, h]``; backward all-gathers along dim 0."""
    return _Region.apply(x, REGIONS[SCATTER_SP], group)


def gather_from_sequence_parallel_region(x: torch.Tensor, group: dist.ProcessGroup | None = None,
                                         tensor_parallel_output_grad: bool = True) -> torch.Tensor:
    """``[s/t, b, h]`` -> all-gather along dim 0 -> ``[s, b, h]``; backward reduce-scatters.

    With ``tensor_parallel_output_grad=False`` (Megatron's flag of the same name) the grad
    arriving in backward is already the full sum on every rank (e.g. a loss computed on the
    gathered output), so backward only splits it along dim 0.
    """
    region = REGIONS[GATHER_SP]
    if not tensor_parallel_output_grad:
        region = region._replace(backward="split")
    return _Region.apply(x, region, group)


def reduce_scatter_to_sequence_parallel_region(x: torch.Tensor,
                                               group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``[s, b, h]`` partial sums -> reduce-scatter along dim 0 -> ``[s/t, b, h]``; backward
    all-gathers."""
    return _Region.apply(x, REGIONS[REDUCE_SCATTER_SP], group)


def allreduce_grad(p: torch.Tensor, region: str, operator: str = "", group=None) -> torch.Tensor:
    """Use a replicated parameter through this when each rank saw different data (other tokens,
    other sequence rows): forward identity, backward all-reduce, so its grad is summed over the
    group. ``operator`` names the parameter in the record (``"ln.weight"``)."""
    return _Region.apply(p, Region(region, "identity", "all_reduce", -1, operator), group)


def allreduce_sequence_parallel_grad(p: torch.Tensor, name: str = "",
                                     group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``allreduce_grad`` for a parameter (e.g. LayerNorm weight ``[h]``) that sees only this
    rank's sequence rows: its grad, a partial sum over them, is summed over the group."""
    return allreduce_grad(p, GRAD_ALLREDUCE_SP, name, group)
