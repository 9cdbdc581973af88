"""Event simulator for pipeline schedules: when does every op start and end, who idles, who holds
how many activations.

Rules (the only ones; no runtime effects beyond an optional point-to-point latency):
  * a rank runs its ops one at a time, in the schedule's order;
  * an op also waits for its dependency: F of (virtual) stage i needs F of i-1 (the activation);
    B or I of i needs B/I of i+1 (the output gradient), the last virtual stage's needs its own F
    (the loss); W needs the I of the same micro-batch on the same rank;
  * a dependency computed on another rank arrives ``latency`` later.
Virtual stage of chunk c on rank r is c*p + r (Megatron-LM's interleaved layout; c = 0 otherwise).
Times are per micro-batch for a whole stage; a chunk of an interleaved rank takes time / chunks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

__all__ = ["Op", "TimelineEvent", "Timeline", "simulate"]


@dataclass(frozen=True)
class Op:
    """One unit of work on one stage: ``kind`` F/B/I/W of ``microbatch`` on model ``chunk``."""

    kind: str
    microbatch: int
    chunk: int = 0

    def label(self, with_chunk: bool = False) -> str:
        """``F3``, or ``F3c1`` (micro-batch 3, chunk 1) when chunks matter."""
        return f"{self.kind}{self.microbatch}" + (f"c{self.chunk}" if with_chunk else "")

    def __str__(self) -> str:
        return self.label(self.chunk != 0)

    __repr__ = __str__


@dataclass(frozen=True)
class TimelineEvent:
    """What ``rank`` did from ``start`` to ``end`` (simulated time, or seconds from the step's
    start on real ranks): an op ("F", "B", "I", "W") of ``microbatch`` on model ``chunk``, or, on
    real ranks only, a message ("send", "recv": posting a send / waiting for a receive; ``tag``
    names the message, the same on its send and its receive, ``peer`` the other rank)."""
    rank: int
    kind: str
    microbatch: int
    chunk: int
    start: float
    end: float
    peer: int | None = None
    tag: int | None = None

    @property
    def op(self) -> Op:
        return Op(self.kind, self.microbatch, self.chunk)


@dataclass
class Timeline:
    """The simulated run: events per rank and the numbers derived from them.

    bubble_fraction = total idle / (ranks x makespan)   (share of the makespan lost, GPipe-style)
    bubble_ratio    = total idle / total busy           (Narayanan et al. SC 2021's (p-1)/m)
    peak_activations[r] = most activations rank r holds at once (F done, its B or W not yet),
    counted in chunk activations; peak_memory[r] divides by chunks (whole-stage micro-batches).
    """

    events: list[list[TimelineEvent]]
    makespan: float
    chunks: int
    peak_activations: list[int]
    busy: list[float] = field(default_factory=list)

    @property
    def ranks(self) -> int:
        return len(self.events)

    @property
    def idle(self) -> list[float]:
        """Idle time of each rank within the makespan."""
        return [self.makespan - b for b in self.busy]

    @property
    def bubble_fraction(self) -> float:
        return sum(self.idle) / (self.ranks * self.makespan)

    @property
    def bubble_ratio(self) -> float:
        return sum(self.idle) / sum(self.busy)

    @property
    def peak_memory(self) -> list[float]:
        return [a / self.chunks for a in self.peak_activations]

    def idle_intervals(self, rank: int) -> list[tuple[float, float]]:
        """The (start, end) gaps of ``rank`` between 0 and the makespan."""
        gaps, t = [], 0.0
        for e in self.events[rank]:
            if e.start > t + 1e-12:
                gaps.append((t, e.start))
            t = e.end
        if self.makespan > t + 1e-12:
            gaps.append((t, self.makespan))
        return gaps

    def to_dict(self) -> dict:
        """JSON-ready numbers (no events)."""
        return {"makespan": self.makespan, "bubble_fraction": self.bubble_fraction,
                "bubble_ratio": self.bubble_ratio, "chunks": self.chunks,
                "peak_activations": list(self.peak_activations),
                "peak_memory": self.peak_memory, "idle": self.idle}


def _peak(ops: Sequence[Any]) -> int:
    """Activations are stashed by F and freed by B, or by W when the backward is split."""
    held = peak = 0
    frees = "W" if any(op.kind == "W" for op in ops) else "B"
    for op in ops:
        held += 1 if op.kind == "F" else -1 if op.kind == frees else 0
        peak = max(peak, held)
    return peak


def _check_number(name: str, value: float) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a non-negative number, got {value!r}")
    return float(value)


def simulate(ops: Sequence[Sequence[Any]], forward: float | Sequence[float] = 1.0,
             backward: float | Sequence[float] = 2.0, *,
             input: float | None = None, weight: float | None = None,
             latency: float = 0.0) -> Timeline:
    """Run ``ops`` (``ops[rank]`` = ordered ops with .kind/.microbatch/.chunk) on the clock.

    ``forward`` and ``backward`` are the times of one micro-batch on one whole stage, or one such
    time per rank (stages that differ: an embedding on the first, a loss on the last). Split
    backwards (I and W, zb-h1) take ``input`` and ``weight`` (each defaults to backward / 2).
    ``latency`` delays every dependency that crosses ranks. Raises ValueError if an op waits for
    something that never runs (a schedule that deadlocks), naming the stuck ops.
    """
    p = len(ops)
    if p == 0:
        raise ValueError("ops has no stages")
    per_rank = not isinstance(forward, (int, float)) or not isinstance(backward, (int, float))
    if per_rank and (input is not None or weight is not None):
        raise ValueError("per-rank forward/backward times take no input/weight split")
    forwards, backwards = ([_check_number(n, x) for x in (v if isinstance(v, Sequence) else [v] * p)]
                           for n, v in (("forward", forward), ("backward", backward)))
    if len(forwards) != p or len(backwards) != p:
        raise ValueError(f"per-rank forward/backward times need one per rank ({p})")
    latency = _check_number("latency", latency)
    backward = backwards[0]
    input = backward / 2 if input is None else _check_number("input", input)
    weight = backward / 2 if weight is None else _check_number("weight", weight)
    kinds = {op.kind for rank_ops in ops for op in rank_ops}
    if not kinds <= {"F", "B", "I", "W"}:
        raise ValueError(f"unknown op kinds {sorted(kinds - {'F', 'B', 'I', 'W'})}")
    chunks = getattr(ops, "chunks", None) or 1 + max((op.chunk for r in ops for op in r), default=0)
    # duration[rank][kind]: how long one op of that kind takes on that rank
    duration = [{"F": forwards[r] / chunks, "B": backwards[r] / chunks,
                 "I": (backwards[r] / 2 if per_rank else input) / chunks,
                 "W": (backwards[r] / 2 if per_rank else weight) / chunks} for r in range(p)]
    last = chunks * p - 1                   # the last (virtual) stage, the one with the loss
    grad = "I" if "I" in kinds else "B"     # the op that sends a gradient back: B, or I if split
    done: dict[tuple[str, int, int], tuple[float, int]] = {}  # (kind, mb, stage) -> (end, rank)

    def dependency(op: Any, rank: int) -> tuple[str, int, int] | None:
        stage = op.chunk * p + rank         # op.chunk is 0 unless the schedule is interleaved
        if op.kind == "F":
            return ("F", op.microbatch, stage - 1) if stage > 0 else None
        if op.kind == "W":
            return ("I", op.microbatch, stage)
        return (grad, op.microbatch, stage + 1) if stage < last else ("F", op.microbatch, stage)

    events: list[list[TimelineEvent]] = [[] for _ in range(p)]
    free = [0.0] * p
    position = [0] * p
    remaining = sum(len(r) for r in ops)
    while remaining:
        progressed = False
        for rank in range(p):
            while position[rank] < len(ops[rank]):
                op = ops[rank][position[rank]]
                dep = dependency(op, rank)
                ready = 0.0
                if dep is not None:
                    if dep not in done:
                        break
                    end, dep_rank = done[dep]
                    ready = end + (latency if dep_rank != rank else 0.0)
                start = max(free[rank], ready)
                free[rank] = start + duration[rank][op.kind]
                key = (op.kind, op.microbatch, op.chunk * p + rank)
                if key in done:
                    raise ValueError(f"stage {rank} runs {op} twice")
                done[key] = (free[rank], rank)
                events[rank].append(TimelineEvent(rank, op.kind, op.microbatch, op.chunk, start, free[rank]))
                position[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = ", ".join(f"stage {r} at {ops[r][position[r]]}" for r in range(p)
                              if position[r] < len(ops[r]))
            raise ValueError(f"schedule deadlocks: every waiting op needs one that never runs "
                             f"first ({stuck})")
    makespan = max(free)
    busy = [sum(e.end - e.start for e in evs) for evs in events]
    return Timeline(events, makespan, chunks, [_peak(r) for r in ops], busy)

