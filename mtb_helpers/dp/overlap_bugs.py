"""Deliberately wrong communication hiding, for ``check_overlap(bug=...)``.

Each bug is a subclass of a correct wrapper that overrides one method (marked ``# BUG``); the
check builds ``swap(bug, OverlappedDDP)`` (or ``ShardedOptimizer``, ``FSDP``) where it would build
the correct one. Each is a slip people make when they write these wrappers by hand. A bucket
divided by p twice is notebook 06's ``DoubleAverage`` (dp/bugs.py) in front of ``OverlappedDDP``,
and ZeRO-1's updated partitions never all-gathered is its ``StaleParams`` in front of
``ShardedOptimizer``: one slip, one class.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

import torch

from mtb_helpers.checking.bug import Bug
from mtb_helpers.dp.bugs import DoubleAverage, StaleParams
from mtb_helpers.dp.fsdp_units import FlatGroup
from mtb_helpers.dp.fsdp_wrapper import FSDP
from mtb_helpers.dp.overlap import OverlappedDDP
from mtb_helpers.dp.sharded_optimizer import ShardedOptimizer

__all__ = ["BUGS", "OVERLAP_BUGS", "WRAPPER_CLASSES", "bugs_for_wrapper"]


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


CHECK = "overlap"
WRAPPER_CLASSES = {"ddp": OverlappedDDP, "zero1": ShardedOptimizer, "fsdp": FSDP}
BUGS: dict[str, Bug] = {
    "ddp-bucket-too-early": Bug(
        "OverlappedDDP: a bucket's all-reduce starts when its first gradient is ready, so the "
        "gradients that arrive later are reduced as zeros", (CHECK,), {OverlappedDDP: BucketTooEarly}),
    "ddp-no-wait": Bug(
        "OverlappedDDP: finish_gradient_synchronization does not wait for the handles, so a rank "
        "ahead of the others reads its buckets before they are reduced", (CHECK,),
        {OverlappedDDP: NoWait}),
    "ddp-double-average": Bug(
        "OverlappedDDP: every bucket divided by p twice, p times too small a gradient", (CHECK,),
        {OverlappedDDP: type("DoubleAverageOverlappedDDP", (DoubleAverage, OverlappedDDP), {})}),
    "ddp-no-sync-communicates": Bug(
        "OverlappedDDP: no_sync still all-reduces every micro-batch (the gradient comes out "
        "right, the communication is repeated)", (CHECK,), {OverlappedDDP: NoSyncCommunicates}),
    "fsdp-prefetch-wrong-module": Bug(
        "FSDP: the prefetch gathers the unit on the wrong side, so the unit that runs next is "
        "gathered on demand", (CHECK,), {FSDP: PrefetchWrongModule}),
    "fsdp-fp16-reduce": Bug(
        "FSDP: gradients reduce-scattered in float16 (the compute dtype) instead of reduce_dtype; "
        "the sum over ranks overflows to inf", (CHECK,), {FSDP: ReduceInComputeDtype},
        {"compute_dtype=torch.float16 (only float16's sum overflows)":
         lambda a: a["compute_dtype"] == torch.float16}),
    "zero1-no-broadcast": Bug(
        "ShardedOptimizer: each rank steps its partition and never shares it: the other ranks keep "
        "stale parameters", (CHECK,),
        {ShardedOptimizer: type("StaleParamsShardedOptimizer", (StaleParams, ShardedOptimizer), {})}),
}
_WRAPPER_OF = {cls: name for name, cls in WRAPPER_CLASSES.items()}


def _on_its_wrapper(bug: Bug) -> Bug:
    """``bug`` with one more need: the check runs the wrapper whose class it replaces."""
    wrapper = next(_WRAPPER_OF[c] for c in bug.replaces if c in _WRAPPER_OF)
    return dataclasses.replace(bug, needs={f"wrapper={wrapper!r}": lambda a: a["wrapper"] == wrapper,
                                           **bug.needs})


BUGS = {name: _on_its_wrapper(bug) for name, bug in BUGS.items()}
OVERLAP_BUGS = tuple(BUGS)


def bugs_for_wrapper(wrapper: str) -> tuple[str, ...]:
    """The bugs whose needs ``wrapper`` meets (the rule ``check_overlap`` asks)."""
    return tuple(n for n, b in BUGS.items() if not b.unmet(wrapper=wrapper))
