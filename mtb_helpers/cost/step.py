"""A training step's time, predicted from what it sends: the α-β model over its collective record.

    with record() as rec:                 # inside a rank: the step (TP MLP, SP block, DP, MoE, CP)
        loss.backward()
    predict_step_time(records, link, compute=0.002)      # records: one CollectiveRecord per rank

The course's layers issue their collectives one at a time and wait for each (``comm.issue``), so
a step takes its computation plus the sum of its collectives' times. Event by event the ranks
wait for the slowest of them (an uneven all-to-all: the largest send buffer), so the i-th event
costs the largest ``predict`` over ranks. ``S`` is read off the record as nccl-tests counts it:
all-gather's output (the input x the group size), reduce-scatter's and all-reduce's input,
all-to-all's rows (this rank's whole send buffer), a message's bytes. A message is counted once,
at its "send": the "recv" of the same hop (context parallelism's ring passes both at once) runs
beside it on the other direction of a full-duplex link.

A pipeline overlaps its ranks; its step is the simulator's makespan with every message taking
its α-β time: :func:`predict_pipeline_step_time`.
"""
from __future__ import annotations

from typing import Sequence

from mtb_helpers.comm.records import CollectiveEvent, CollectiveRecord
from mtb_helpers.cost.model import Link, predict
from mtb_helpers.pp.schedules import schedule as make_schedule
from mtb_helpers.pp.simulator import simulate

__all__ = ["event_size", "event_time", "predict_step_time", "predict_pipeline_step_time"]

_MODEL = {"all_reduce": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter",
          "all_to_all": "all-to-all", "send": "send/recv"}   # a "recv" costs nothing more: see below


def event_size(e: CollectiveEvent) -> int:
    """nccl-tests' S of one recorded event (0 for a local split)."""
    if e.op == "all_gather":
        return e.bytes * e.group_size
    if e.op == "all_to_all":
        return e.bytes
    return e.bytes if e.op in _MODEL else 0


def event_time(e: CollectiveEvent, link: Link) -> float:
    """Predicted seconds of one recorded event on ``link`` (0 for a split or one rank)."""
    if e.op not in _MODEL or e.group_size < 2:
        return 0.0
    return predict(_MODEL[e.op], event_size(e), 2 if e.op == "send" else e.group_size, link)


def predict_step_time(records: CollectiveRecord | Sequence[CollectiveRecord], link: Link,
                      compute: float = 0.0) -> float:
    """Seconds of a step whose collectives run one after another: ``compute`` plus, event by
    event, the slowest rank's α-β time. ``records``: one rank's record or every rank's (the ranks
    issue the same sequence of collectives)."""
    if isinstance(records, CollectiveRecord):
        records = [records]
    lengths = {len(r.communicating()) for r in records}
    if len(lengths) != 1:
        raise ValueError(f"the ranks' records differ in length ({sorted(lengths)}): not one step")
    per_rank = [[event_time(e, link) for e in r.communicating()] for r in records]
    return compute + sum(max(times) for times in zip(*per_rank))


def predict_pipeline_step_time(schedule: str, stages: int, microbatches: int,
                               op_time: tuple[float, float], message_bytes: int, link: Link,
                               chunks: int = 1) -> float:
    """The makespan of ``schedule`` with ops of ``op_time = (F, B)`` seconds and every
    activation or gradient message of ``message_bytes`` taking its α-β time between stages."""
    ops = make_schedule(schedule, stages, microbatches, chunks)
    latency = predict("send/recv", message_bytes, 2, link)
    return simulate(ops, forward=op_time[0], backward=op_time[1], latency=latency).makespan
