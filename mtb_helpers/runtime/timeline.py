"""What each rank did, and when, under an emulated link: ``run(fn, link=...)`` returns a
:class:`RunResults`, the per-rank results with ``.timeline``, whose ``ranks[r]`` lists rank r's
:class:`LinkEvent` s in the order they ended. Times are seconds from one zero shared by every rank
(right after a barrier at the call's start), so ranks can be drawn on one axis.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

__all__ = ["LinkEvent", "LinkTimeline", "RunResults"]


@dataclass(frozen=True)
class LinkEvent:
    """One interval on one rank: ``kind`` ``"compute"`` (a ``padded`` block, ``name`` its name) or
    ``"comm"`` (``name`` the torch.distributed function, ``bytes`` nccl-tests' size S of it, see
    ``mtb_helpers.cost.model``). ``start``/``end``: seconds from the call's zero; a collective
    starts when every rank of its group has reached it, a receive when its message left the sender
    (or was posted, if later). ``modelled``: the seconds the model asked for, time scale included;
    ``end - start`` exceeds it only when the real work overran it."""
    kind: str
    name: str
    bytes: int
    start: float
    end: float
    modelled: float

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def overrun(self) -> float:
        """Seconds beyond the modelled time (0 when the model was honoured)."""
        return max(0.0, self.seconds - self.modelled)


@dataclass
class LinkTimeline:
    """Every rank's events of one ``run(..., link=...)`` call: ``ranks[r]`` is rank r's list.
    ``link`` is the emulated link, ``time_scale`` the stretch factor every modelled time got."""
    ranks: list[list[LinkEvent]]
    link: Any
    time_scale: float = 1.0

    def events(self, rank: int | None = None, kind: str | None = None,
               name: str | None = None) -> list[LinkEvent]:
        """Events matching every filter given, rank by rank."""
        ranks = range(len(self.ranks)) if rank is None else [rank]
        return [e for r in ranks for e in self.ranks[r]
                if (kind is None or e.kind == kind) and (name is None or e.name == name)]

    @property
    def makespan(self) -> float:
        """Seconds from the zero to the last event's end (0 without events)."""
        return max((e.end for evs in self.ranks for e in evs), default=0.0)

    def in_model_time(self) -> "LinkTimeline":
        """The same timeline with every time divided by ``time_scale`` (the link's own seconds)."""
        s = self.time_scale
        return LinkTimeline([[replace(e, start=e.start / s, end=e.end / s, modelled=e.modelled / s)
                          for e in evs] for evs in self.ranks], self.link, 1.0)

    def label(self) -> str:
        """For figure titles: ``'emulated link α = 5 µs, β = 50 GB/s, 100× slower than real
        time'`` (the last part only when time_scale != 1)."""
        text = f"emulated link {self.link.describe()}"
        if self.time_scale != 1:
            text += f", {self.time_scale:g}× slower than real time"
        return text


class RunResults(list):
    """``run``'s list of per-rank results, with the call's ``timeline`` attached."""

    def __init__(self, results: list, timeline: LinkTimeline):
        super().__init__(results)
        self.timeline = timeline
