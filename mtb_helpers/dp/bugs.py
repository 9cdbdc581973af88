"""Deliberately wrong data-parallel strategies, for ``check_data_parallel(bug=...)``.

Each bug is a mixin overriding one method (marked ``# BUG``) that the strategies' classes share
(``average``, ``zero_grad``: ``DDP`` and ``ZeRO1/2`` in strategies.py, ``FSDP`` for ZeRO-3);
``strategy_bug(text, wrong, "ddp", "zero1", ...)`` puts it in front of every strategy that can make
it, so the check can ``swap`` whichever strategy it is about to build (``Bug.replaces``: correct
class -> wrong class), and declares the same strategies as the bug's need (``Bug.needs``): the one
rule ``resolve`` applies, and ``BUGS_BY_STRATEGY`` shows. The last two set PyTorch up wrongly in the
comparison of ``dp/pytorch.py``.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from mtb_helpers.checking.bug import Bug, names_for
from mtb_helpers.dp.fsdp import STRATEGY_CLASSES

__all__ = ["BUGS", "DP_BUGS", "BUGS_BY_STRATEGY", "DoubleAverage", "SumNotAverage",
           "StaleParams", "GradsNotCleared", "strategy_bug"]


TORCH_MODEL = "mtb_helpers.dp.pytorch.torch_model"   # by name: see checking.bug.swap
CHECK = "data_parallel"


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


def strategy_bug(description: str, wrong: type, *strategies: str) -> Bug:
    """A bug of the data-parallel check that ``strategies`` (names of ``STRATEGY_CLASSES``) make:
    each one's class with ``wrong``'s one override in front of it (``class X(wrong, strategy)``),
    and the need ``strategy in strategies``, which ``resolve`` asks before any rank starts."""
    replaces = {STRATEGY_CLASSES[s]: type(f"{wrong.__name__}{STRATEGY_CLASSES[s].__name__}",
                                          (wrong, STRATEGY_CLASSES[s]), {}) for s in strategies}
    return Bug(description, (CHECK,), replaces,
               needs={f"strategy in {strategies}": lambda a: a["strategy"] in strategies})


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
        StaleParams, "zero1", "zero2"),
    "dp-grads-not-cleared": strategy_bug(
        "DDP / ZeRO-1 / ZeRO-3: gradients are never cleared between steps, so each step uses "
        "the sum of every gradient so far (one step cannot see it; ZeRO-2 frees its grads, so it is right by "
        "accident)",
        GradsNotCleared, "ddp", "zero1", "zero3"),
    "no-ddp-wrapper": Bug(
        "PyTorch's DDP: the bare module, no DistributedDataParallel, so each rank steps on the "
        "gradient of its own rows", ("pytorch_data_parallel",),
        {TORCH_MODEL: ddp_without_wrapper},
        needs={"strategy='ddp'": lambda a: a["strategy"] == "ddp"}),
    "fsdp-sum-not-average": Bug(
        "PyTorch's FSDP2: set_gradient_divide_factor(1.0), so the reduce-scatter sums: p times "
        "the batch gradient", ("pytorch_data_parallel",), {TORCH_MODEL: fsdp_sum_not_average},
        needs={"strategy='fsdp'": lambda a: a["strategy"] == "fsdp"}),
}
DP_BUGS = names_for(BUGS, CHECK)
# what the check's bugs need, strategy by strategy (for reading: the check asks Bug.needs itself)
BUGS_BY_STRATEGY = {s: tuple(name for name in DP_BUGS if not BUGS[name].unmet(strategy=s))
                    for s in STRATEGY_CLASSES}
