"""A training step's time, predicted from what it sends: the α-β model over its collective record.

    with record() as rec:                 # inside a rank: the step (TP MLP, SP block, DP, MoE, CP)
        loss.backward()
    predict_step_time(records, link, compute=0.002)      # records: one CollectiveRecord per rank

The course's layers issue their collectives one at a time and wait for each (plain blocking
``torch.distributed`` calls), so a step takes its computation plus the sum of its collectives'
times. Event by event the ranks wait for the slowest of them (an uneven all-to-all: the largest
send buffer), so the i-th event costs the largest ``predict`` over ranks. ``S`` is read off the
record as nccl-tests counts it: all-gather's output (the input x the group size), reduce-scatter's
and all-reduce's input, all-to-all's rows (this rank's whole send buffer), a message's bytes. A
message is counted once, at its "send": the "recv" of the same hop (context parallelism's ring
passes both at once) runs beside it on the other direction of a full-duplex link.

A pipeline overlaps its ranks; its step is the simulator's makespan with every message taking
its α-β time: :func:`predict_pipeline_step_time`. A step on a tp x pp x dp x cp grid (the
capstone's) combines both: :func:`predict_grid_step_time`. After its own last op each stage sums
its sequence-parallel LayerNorm and bias grads over its tensor group (``capstone/finalize.py``),
reduces its gradients over its data-parallel group and steps: the step ends when the last stage does.
"""
from __future__ import annotations

import numbers
from typing import Sequence

from mtb_helpers.comm.records import CollectiveEvent, CollectiveRecord
from mtb_helpers.cost.model import Link, predict, whole
from mtb_helpers.pp.schedules import schedule as make_schedule
from mtb_helpers.pp.simulator import simulate

__all__ = ["event_time", "predict_step_time", "predict_pipeline_step_time",
           "op_comm_time", "predict_grid_step_time"]

_MODEL = {"all_reduce": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter",
          "all_to_all": "all-to-all", "send": "send/recv"}   # a "recv" costs nothing more: see below


def event_time(e: CollectiveEvent, link: Link) -> float:
    """Predicted seconds of one recorded event on ``link`` (0 for a split or one rank), its size
    nccl-tests' S (the module docstring says what that is for each collective)."""
    if e.op not in _MODEL or e.group_size < 2:
        return 0.0
    size = e.bytes * e.group_size if e.op == "all_gather" else e.bytes
    return predict(_MODEL[e.op], size, 2 if e.op == "send" else e.group_size, link)


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
    activation or gradient message of ``message_bytes`` taking its α-β time between stages.
    Counts may be numpy ints, times numpy floats (the simulator is given Python's)."""
    stages, microbatches = whole("stages", stages), whole("microbatches", microbatches)
    chunks = whole("chunks", chunks)
    op_time = tuple(float(t) if isinstance(t, numbers.Real) and not isinstance(t, bool) else t
                    for t in op_time)
    ops = make_schedule(schedule, stages, microbatches, chunks)
    latency = predict("send/recv", message_bytes, 2, link)
    return simulate(ops, forward=op_time[0], backward=op_time[1], latency=latency).makespan


def op_comm_time(rec: CollectiveRecord, link: Link) -> float:
    """Seconds one pipeline op waits for its collectives on ``link``: every event of ``rec`` but
    the pipeline's own messages (their time is the simulator's latency). A ring hop counts once,
    at its send (its receive runs beside it); the pipeline's messages are told apart by their
    region (``"activation -> rank 1"``, ``"input grad <- rank 0"``: ``pp.p2p``)."""
    return sum(event_time(e, link) for e in rec.communicating() if " rank " not in e.region)


def predict_grid_step_time(ranks: Sequence[dict], compute: Sequence[tuple[float, float]], link: Link,
                           schedule: str = "1f1b", after_compute: float = 0.0) -> float:
    """Seconds of one training step on a pipeline of data-, tensor- and context-parallel ranks.

    ``ranks[r]``: rank r's ``{"stage": s, "F": [record of each F op], "B": [...], "after":
    record of what follows the last op (the gradient reduction)}``; ``compute[s]``: the padded
    (F, B) seconds of one micro-batch on stage s; ``after_compute``: the optimizer's seconds.
    Stage s's op takes ``compute[s]`` plus the slowest of its ranks' and ops' ``op_comm_time``;
    the messages between stages (the largest recorded) take their α-β time."""
    stages = 1 + max(r["stage"] for r in ranks)
    if len(compute) != stages:
        raise ValueError(f"compute has {len(compute)} (F, B) pairs for {stages} stages")
    microbatches = {len(r["F"]) for r in ranks} | {len(r["B"]) for r in ranks}
    if len(microbatches) != 1:
        raise ValueError(f"the ranks ran different numbers of ops ({sorted(microbatches)})")
    of = [[r for r in ranks if r["stage"] == s] for s in range(stages)]
    times = [[compute[s][i] + max(op_comm_time(rec, link) for r in of[s] for rec in r[kind])
              for s in range(stages)] for i, kind in enumerate("FB")]
    sends = [e.bytes for r in ranks for kind in "FB" for rec in r[kind] for e in rec
             if e.op == "send" and " rank " in e.region]
    latency = predict("send/recv", max(sends), 2, link) if sends else 0.0
    ops = make_schedule(schedule, stages, microbatches.pop())
    timeline = simulate(ops, forward=times[0], backward=times[1], latency=latency)
    return max(max(e.end for e in timeline.events[s]) + after_compute
               + predict_step_time([r["after"] for r in of[s]], link) for s in range(stages))
