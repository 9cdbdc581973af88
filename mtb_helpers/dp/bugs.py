"""Deliberately wrong data parallelism: the strategies of ``check_data_parallel(bug=...)``
(notebook 06), the wrappers of ``check_overlap(bug=...)`` (notebook 14), and PyTorch set up wrongly
in ``dp/pytorch.py``'s comparison.

Notebook 06's bugs are mixins overriding one method (marked ``# BUG``) that the strategies' classes
share; ``strategy_bug`` puts one in front of each strategy class that can make the slip. Notebook
14's bugs are subclasses of one wrapper, each a slip people make when they write it by hand
(``wrapper_bug``); a bucket divided by p twice and ZeRO-1's partitions never all-gathered are
notebook 06's own classes in front of the wrapper: one slip, one class. Either way the bug's needs
(the strategy or wrapper that builds the class it replaces) are where it applies.
"""
from __future__ import annotations

import contextlib
import copy
from typing import Iterator

import torch
from torch import nn

from mtb_helpers.checking.bug import Bug, Setting, names_for, register
from mtb_helpers.dp.fsdp import STRATEGY_CLASSES
from mtb_helpers.dp.fsdp_units import FlatGroup
from mtb_helpers.dp.fsdp_wrapper import FSDP
from mtb_helpers.dp.overlap import OverlappedDDP
from mtb_helpers.dp.sharded_optimizer import ShardedOptimizer

__all__ = ["BUGS", "DP_BUGS", "BUGS_BY_STRATEGY", "DoubleAverage", "SumNotAverage",
           "StaleParams", "GradsNotCleared", "strategy_bug", "wrapper_bug", "OVERLAP_BUGS",
           "WRAPPER_CLASSES", "BucketTooEarly", "NoWait", "NoSyncCommunicates",
           "PrefetchWrongModule", "ReduceInComputeDtype"]


TORCH_MODEL = "mtb_helpers.dp.pytorch.torch_model"   # by name: see checking.bug.swap
CHECK, OVERLAP = "data_parallel", "overlap"


class DoubleAverage:
    """dp-double-average: e.g. the loss already divided by p, and the reduction averages again."""

    def average(self, summed: torch.Tensor) -> torch.Tensor:
        return super().average(super().average(summed))   # BUG: divided by p twice


class SumNotAverage:
    """dp-sum-not-average: the all-reduce sums, and nobody divides by p."""

    def average(self, summed: torch.Tensor) -> torch.Tensor:
        return summed                     # BUG: the sum over ranks, p times the batch gradient


class StaleParams:
    """zero-stale-params (and check_overlap's zero1-no-broadcast): the sharded step without the
    all-gather after it."""

    def _share_partitions(self) -> None:
        pass                              # BUG: no all-gather: the other ranks' shards stay stale


class GradsNotCleared:
    """dp-grads-not-cleared: ``zero_grad`` forgotten, so backward adds to last step's gradient."""

    def zero_grad(self) -> None:
        pass                              # BUG: step 2 uses step 1's grad + step 2's, step 3 all three ...


class BucketTooEarly(OverlappedDDP):
    """ddp-bucket-too-early: a bucket starts when its first gradient is ready, not its last."""

    def _bucket_ready(self, i: int) -> bool:
        return any(param in self._ready for param in self._buckets[i])   # BUG: any, not all


class NoWait(OverlappedDDP):
    """ddp-no-wait: the handles are never waited for: the buckets are read as they are."""

    def _wait(self, work) -> None:
        pass                                                        # BUG: no work.wait()


class NoSyncCommunicates(OverlappedDDP):
    """ddp-no-sync-communicates: ``no_sync`` that still reduces every micro-batch."""

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        yield                                                       # BUG: self._sync never cleared


class PrefetchWrongModule(FSDP):
    """fsdp-prefetch-wrong-module: prefetches the neighbour on the wrong side (the unit that just
    ran), so the unit that runs next is gathered on demand, exposed."""

    def _next_in(self, order: list[int], u: int, step: int) -> int | None:
        return super()._next_in(order, u, -step)                    # BUG: the other direction


class ReduceInComputeDtype(FSDP):
    """fsdp-fp16-reduce: gradients reduced in the compute dtype (float16), whose sum overflows."""

    def _reduce_dtype(self, g: FlatGroup) -> torch.dtype:
        return g.compute_dtype                                      # BUG: not reduce_dtype


def strategy_bug(description: str, wrong: type, *strategies: str, on: type | None = None) -> Bug:
    """A bug of the data-parallel check that ``strategies`` (names of ``STRATEGY_CLASSES``) make:
    each one's class (or the one class ``on`` they all build, e.g. ``ShardedOptimizer``) with
    ``wrong``'s one override in front of it (``class X(wrong, strategy)``), needing one of them."""
    correct = [on] if on is not None else [STRATEGY_CLASSES[s] for s in strategies]
    replaces = {c: type(f"{wrong.__name__}{c.__name__}", (wrong, c), {}) for c in correct}
    return Bug(description, (CHECK,), replaces,
               needs={f"strategy in {strategies}": lambda a: a["strategy"] in strategies})


def wrapper_bug(description: str, wrapper: str, wrong: type, needs: dict | None = None) -> Bug:
    """A bug of ``check_overlap``: ``wrong`` in place of the class of ``wrapper`` (a name of
    ``WRAPPER_CLASSES``), needing that wrapper, and ``needs`` if given."""
    return Bug(description, (OVERLAP,), {WRAPPER_CLASSES[wrapper]: wrong},
               {f"wrapper={wrapper!r}": Setting("wrapper", wrapper), **(needs or {})})


def ddp_without_wrapper(strategy: str, model: nn.Sequential) -> nn.Module:
    """no-ddp-wrapper."""
    return copy.deepcopy(model)   # BUG: no DistributedDataParallel, so no gradient is averaged


def fsdp_sum_not_average(strategy: str, model: nn.Sequential) -> nn.Module:
    """fsdp-sum-not-average."""
    from mtb_helpers.dp.pytorch import torch_model   # not at import: see checking.bug.swap
    model = torch_model(strategy, model)
    for m in model.modules():
        if hasattr(m, "set_gradient_divide_factor"):
            m.set_gradient_divide_factor(1.0)   # BUG: the reduce-scatter sums, nobody divides by p
    return model


BUGS: dict[str, Bug] = {
    "dp-double-average": strategy_bug(
        "data parallel: the reduced gradient is divided by p twice (e.g. the loss already divided "
        "by p, then averaged again), p times too small",
        DoubleAverage, "ddp", "zero1", "zero2", "zero3"),
    "dp-sum-not-average": strategy_bug(
        "data parallel: the gradient is summed over ranks and never divided by p, p times the "
        "whole batch's gradient",
        SumNotAverage, "ddp", "zero1", "zero2", "zero3"),
    "zero-stale-params": strategy_bug(
        "ZeRO-1/2: no all-gather of the parameters after the sharded Adam step, so every rank's "
        "copy is updated only in its own shard",
        StaleParams, "zero1", "zero2", on=ShardedOptimizer),
    "dp-grads-not-cleared": strategy_bug(
        "DDP / ZeRO-1 / ZeRO-3: gradients are never cleared between steps, so each step uses "
        "the sum of every gradient so far (one step cannot see it; ZeRO-2 frees its grads, so it is right by "
        "accident)",
        GradsNotCleared, "ddp", "zero1", "zero3"),
    "no-ddp-wrapper": Bug(
        "PyTorch's DDP: the bare module, no DistributedDataParallel, so each rank steps on the "
        "gradient of its own rows", ("pytorch_data_parallel",),
        {TORCH_MODEL: ddp_without_wrapper},
        needs={"strategy='ddp'": Setting("strategy", "ddp")}),
    "fsdp-sum-not-average": Bug(
        "PyTorch's FSDP2: set_gradient_divide_factor(1.0), so the reduce-scatter sums: p times "
        "the batch gradient", ("pytorch_data_parallel",), {TORCH_MODEL: fsdp_sum_not_average},
        needs={"strategy='fsdp'": Setting("strategy", "fsdp")}),
}
DP_BUGS = names_for(BUGS, CHECK)
# what the check's bugs need, strategy by strategy (for reading: the check asks Bug.needs itself)
BUGS_BY_STRATEGY = {s: names_for(BUGS, CHECK, strategy=s) for s in STRATEGY_CLASSES}

WRAPPER_CLASSES = {"ddp": OverlappedDDP, "zero1": ShardedOptimizer, "fsdp": FSDP}
BUGS.update({
    "ddp-bucket-too-early": wrapper_bug(
        "OverlappedDDP: a bucket's all-reduce starts when its first gradient is ready, so the "
        "gradients that arrive later are reduced as zeros", "ddp", BucketTooEarly),
    "ddp-no-wait": wrapper_bug(
        "OverlappedDDP: finish_gradient_synchronization does not wait for the handles, so a rank "
        "ahead of the others reads its buckets before they are reduced", "ddp", NoWait),
    "ddp-double-average": wrapper_bug(
        "OverlappedDDP: every bucket divided by p twice, p times too small a gradient", "ddp",
        BUGS["dp-double-average"].replaces[OverlappedDDP]),   # the same class
    "ddp-no-sync-communicates": wrapper_bug(
        "OverlappedDDP: no_sync still all-reduces every micro-batch (the gradient comes out "
        "right, the communication is repeated)", "ddp", NoSyncCommunicates),
    "fsdp-prefetch-wrong-module": wrapper_bug(
        "FSDP: the prefetch gathers the unit on the wrong side, so the unit that runs next is "
        "gathered on demand", "fsdp", PrefetchWrongModule),
    "fsdp-fp16-reduce": wrapper_bug(
        "FSDP: gradients reduce-scattered in float16 (the compute dtype) instead of reduce_dtype; "
        "the sum over ranks overflows to inf", "fsdp", ReduceInComputeDtype,
        {"compute_dtype=torch.float16 (only float16's sum overflows)":
         Setting("compute_dtype", torch.float16)}),
    "zero1-no-broadcast": wrapper_bug(
        "ShardedOptimizer: each rank steps its partition and never shares it: the other ranks keep "
        "stale parameters", "zero1", BUGS["zero-stale-params"].replaces[ShardedOptimizer]),
})
OVERLAP_BUGS = names_for(BUGS, OVERLAP)


register("dp", BUGS)   # at import: see checking/bug.py
