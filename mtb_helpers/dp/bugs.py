"""Deliberately wrong data-parallel strategies, for ``check_data_parallel(bug=...)``.

Each mistake is a subclass of a correct strategy that overrides one method (marked ``# BUG``).
The first class of each family shows the mistake; a mistake that several strategies can make gets
one subclass per strategy that reuses that very method, so the check can ``swap`` whichever
strategy it is about to build (``Bug.replaces``: correct class -> wrong class).
"""
from __future__ import annotations

import torch
from torch import nn

from mtb_helpers.checking.bug import Bug, swap
from mtb_helpers.dp.fsdp import STRATEGY_CLASSES, ZeRO3
from mtb_helpers.dp.strategies import DDP, Adam, ZeRO1, ZeRO2

__all__ = ["BUGS", "DP_BUGS", "BUGS_BY_STRATEGY", "DoubleAverage", "SumNotAverage",
           "StaleParams", "GradsNotCleared", "build_strategy"]


class DoubleAverage(DDP):
    """dp-double-average: e.g. the loss already divided by t, and the reduction averages again."""

    def average(self, summed: torch.Tensor) -> torch.Tensor:
        return summed / self.t / self.t   # BUG: divided by t twice


class SumNotAverage(DDP):
    """dp-sum-not-average: the all-reduce sums, and nobody divides by t."""

    def average(self, summed: torch.Tensor) -> torch.Tensor:
        return summed                     # BUG: the sum over ranks, t times the batch gradient


class StaleParams(ZeRO1):
    """zero-stale-params: the sharded step without the all-gather after it."""

    def step(self) -> None:
        self.optimizer.step()             # BUG: no gather_params(): the other shards stay stale


class GradsNotCleared(DDP):
    """dp-grads-not-cleared: ``zero_grad`` forgotten, so backward adds to last step's gradient."""

    def zero_grad(self) -> None:
        pass                              # BUG: step 2 uses g1 + g2, step 3 g1 + g2 + g3 ...


# The same overridden method on the other strategies.
class DoubleAverageZeRO1(ZeRO1):
    average = DoubleAverage.average


class DoubleAverageZeRO2(ZeRO2):
    average = DoubleAverage.average


class DoubleAverageZeRO3(ZeRO3):
    average = DoubleAverage.average


class SumNotAverageZeRO1(ZeRO1):
    average = SumNotAverage.average


class SumNotAverageZeRO2(ZeRO2):
    average = SumNotAverage.average


class SumNotAverageZeRO3(ZeRO3):
    average = SumNotAverage.average


class StaleParamsZeRO2(ZeRO2):
    step = StaleParams.step


class GradsNotClearedZeRO1(ZeRO1):
    zero_grad = GradsNotCleared.zero_grad


class GradsNotClearedZeRO3(ZeRO3):
    zero_grad = GradsNotCleared.zero_grad


CHECK = "data_parallel"
BUGS: dict[str, Bug] = {
    "dp-double-average": Bug(
        "data parallel: the reduced gradient is divided by t twice (e.g. the loss already divided "
        "by t, then averaged again), t times too small", (CHECK,),
        {DDP: DoubleAverage, ZeRO1: DoubleAverageZeRO1, ZeRO2: DoubleAverageZeRO2,
         ZeRO3: DoubleAverageZeRO3}),
    "dp-sum-not-average": Bug(
        "data parallel: the gradient is summed over ranks and never divided by t, t times the "
        "whole batch's gradient", (CHECK,),
        {DDP: SumNotAverage, ZeRO1: SumNotAverageZeRO1, ZeRO2: SumNotAverageZeRO2,
         ZeRO3: SumNotAverageZeRO3}),
    "zero-stale-params": Bug(
        "ZeRO-1/2: no all-gather of the parameters after the sharded Adam step, so every rank's "
        "copy is updated only in its own shard", (CHECK,),
        {ZeRO1: StaleParams, ZeRO2: StaleParamsZeRO2}),
    "dp-grads-not-cleared": Bug(
        "DDP / ZeRO-1 / ZeRO-3: gradients are never cleared between steps, so step k uses "
        "g1 + ... + gk (one step cannot see it; ZeRO-2 frees its grads, so it is right by "
        "accident)", (CHECK,),
        {DDP: GradsNotCleared, ZeRO1: GradsNotClearedZeRO1, ZeRO3: GradsNotClearedZeRO3}),
}
DP_BUGS = tuple(BUGS)
BUGS_BY_STRATEGY = {s: tuple(name for name, bug in BUGS.items() if cls in bug.replaces)
                    for s, cls in STRATEGY_CLASSES.items()}


def build_strategy(strategy: str, model: nn.Sequential, start: dict, adam: Adam = Adam(),
                   bug: str | None = None, group=None):
    """Inside a rank: the strategy object (``DDP``, ``ZeRO1``, ``ZeRO2`` or ``ZeRO3``) for this
    rank, or its wrong subclass when ``bug`` names a mistake."""
    cls = swap(BUGS[bug] if bug is not None else None, STRATEGY_CLASSES[strategy])
    return cls(model, start, adam, group)
