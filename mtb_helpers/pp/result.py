"""What one pipeline step on real ranks returns (``pipeline_step``): the loss, the grads, the
measured timeline of ops and messages, the peaks, the records; the measured run as a simulator
``Timeline`` (the same bubble, the same Gantt) and the hop time of this machine's link read from
it. Apart from the simulator, which is arithmetic and imports no torch.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch

from mtb_helpers.comm.records import CollectiveRecord
from mtb_helpers.pp.simulator import Op, Timeline, TimelineEvent

__all__ = ["PipelineResult"]


@dataclass
class PipelineResult:
    """One pipeline step: loss, grads by parameter name, the measured timeline, peaks, records."""
    loss: float
    grads: dict[str, torch.Tensor]
    timeline: list[TimelineEvent]
    peak_stashed: list[int]
    records: list[CollectiveRecord]
    schedule: list = field(default_factory=list)
    stash_bytes: list[int] = field(default_factory=list)       # peak bytes held per rank
    recompute_bytes: list[int] = field(default_factory=list)   # peak bytes one re-run forward saves
    config: dict = field(default_factory=dict)

    def ops(self, rank: int) -> list[Op]:
        """The compute ops ``rank`` ran, in the order it ran them."""
        return [e.op for e in self.measured().events[rank]]

    def measured(self) -> Timeline:
        """The compute ops as a simulator ``Timeline``: same bubble definition, same Gantt."""
        events = [[e for e in self.timeline if e.rank == r and e.kind in "FBIW"]
                  for r in range(len(self.peak_stashed))]
        makespan = max(e.end for evs in events for e in evs)
        busy = [sum(e.end - e.start for e in evs) for evs in events]
        return Timeline(events, makespan, self.config.get("chunks", 1), list(self.peak_stashed),
                        busy)

    @property
    def bubble_fraction(self) -> float:
        """Idle / (ranks x makespan) from the measured timeline (waits for data count as idle)."""
        return self.measured().bubble_fraction

    def hops(self) -> list[float]:
        """Seconds each message a receiver was already waiting for took, from its send (posted
        when the sender's op ended) to the receiver having it: the α of this machine's link
        between two ranks, scheduling of the processes on the CPU included."""
        sent = {(e.rank, e.tag): e.start for e in self.timeline if e.kind == "send"}
        return [e.end - sent[(e.peer, e.tag)] for e in self.timeline
                if e.kind == "recv" and (e.peer, e.tag) in sent and e.start <= sent[(e.peer, e.tag)]]

    @property
    def hop_latency(self) -> float:
        """The median of ``hops()`` (0 when no receiver waited: one stage, or nothing to wait
        for): what ``simulate(..., latency=)`` needs to predict this machine's timeline."""
        hops = self.hops()
        return statistics.median(hops) if hops else 0.0
