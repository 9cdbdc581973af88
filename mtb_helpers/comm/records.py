"""The record of every collective a rank issued: what, where, which way, how many bytes.

Inside ``with record() as rec:`` every operation a region issues on this rank (through
``comm.issue``) is appended to ``rec`` as a ``CollectiveEvent`` (op, region, direction, shape,
bytes), in the order the rank issued it, forward and backward alike (call ``.backward()`` inside
the block). Local splits are recorded too, with ``sent_bytes == 0``, so a step trace can show
them; ``rec.count("all_reduce")`` counts only what you ask for. Records are plain data: a check
returns them from its ranks and a notebook compares them with the formulas.
"""
from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field
from typing import Iterator

import torch

OPS = ("all_reduce", "all_gather", "reduce_scatter", "split", "all_to_all", "send", "recv")


@dataclass(frozen=True)
class CollectiveEvent:
    """One operation a region issued on one rank.

    ``shape``/``bytes`` describe the tensor this rank handed to the operation; ``out_shape`` the
    tensor it got back. ``sent_bytes`` is what this rank sends with the usual ring algorithm for a
    group of ``group_size`` ranks and N = ``bytes``: all-reduce 2(t-1)/t N, all-gather (t-1) N,
    reduce-scatter (t-1) N_out = (t-1)/t N (N_out the bytes of the chunk it keeps; gloo's own
    reduce-scatter is an all-reduce inside and sends more, notebook 00 measures it), split 0
    (local slicing, no communication), all-to-all the bytes of the rows addressed to the other
    ranks (what leaves this rank; its own rows stay), send/recv the bytes of the message.
    """
    op: str
    region: str
    operator: str        # which use of the region: the paper's operator ("f", "g"), the parameter
                         # whose grad is all-reduced ("ln.weight", "gate.weight"), a re-gather in
                         # backward ("re-gather"), or "" when nothing more needs saying
    direction: str       # "forward" or "backward"
    shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    dtype: str
    bytes: int
    sent_bytes: int
    group_size: int
    seconds: float | None = field(default=None, compare=False)   # a time, not what was sent

    def describe(self) -> str:
        """E.g. ``'forward all_reduce (g) [6, 8] float32: 192 B in, 192 B sent'``."""
        name = f"{self.op} ({self.operator})" if self.operator else self.op
        return (f"{self.direction} {name} {list(self.shape)} {self.dtype}: "
                f"{self.bytes} B in, {self.sent_bytes} B sent")


class CollectiveRecord:
    """The ordered events one rank issued inside ``with record()``; plain data, picklable.

    With ``keep_tensors=True`` (used by the step trace) ``tensors[i]`` holds detached copies of
    the input and output of event ``i``; ``without_tensors()`` drops them before shipping.
    """

    def __init__(self, events: list[CollectiveEvent] | None = None, keep_tensors: bool = False):
        self.events: list[CollectiveEvent] = list(events or [])
        self.keep_tensors = keep_tensors
        self.tensors: list[tuple[torch.Tensor, torch.Tensor] | None] = []

    def __len__(self) -> int:
        return len(self.events)

    def __iter__(self) -> Iterator[CollectiveEvent]:
        return iter(self.events)

    def __getitem__(self, i: int) -> CollectiveEvent:
        return self.events[i]

    def __repr__(self) -> str:
        return f"CollectiveRecord({len(self.events)} events: {self.summary()})"

    def select(self, op: str | None = None, direction: str | None = None,
               region: str | None = None) -> list[CollectiveEvent]:
        """The events matching every filter given (``region`` matches the name or the operator)."""
        return [e for e in self.events
                if (op is None or e.op == op) and (direction is None or e.direction == direction)
                and (region is None or region in (e.region, e.operator))]

    def count(self, op: str | None = None, direction: str | None = None,
              region: str | None = None) -> int:
        """How many events match, e.g. ``rec.count("all_reduce", "forward")``."""
        return len(self.select(op, direction, region))

    def total_bytes(self, op: str | None = None, direction: str | None = None,
                    sent: bool = False) -> int:
        """Sum of ``bytes`` (or ``sent_bytes``) over the matching events."""
        return sum(e.sent_bytes if sent else e.bytes for e in self.select(op, direction))

    def communicating(self) -> list[CollectiveEvent]:
        """The events that moved data between ranks (everything but local splits)."""
        return [e for e in self.events if e.op != "split"]

    def summary(self) -> str:
        """One line per direction, e.g. ``'forward: 1 all_reduce (192 B)'``; local splits left out.
        forward and backward always appear; other directions (an optimizer ``step``) when used."""
        parts = []
        for direction in dict.fromkeys(["forward", "backward", *(e.direction for e in self)]):
            counts: dict[str, list[int]] = {}
            for e in self.communicating():
                if e.direction == direction:
                    n, b = counts.get(e.op, [0, 0])
                    counts[e.op] = [n + 1, b + e.bytes]
            text = ", ".join(f"{n} {op} ({b} B)" for op, (n, b) in counts.items()) or "nothing"
            parts.append(f"{direction}: {text}")
        return "; ".join(parts)

    def without_tensors(self) -> "CollectiveRecord":
        return CollectiveRecord(self.events)

    def to_list(self) -> list[dict]:
        """JSON-ready: one dict per event (shapes as lists)."""
        return [{**asdict(e), "shape": list(e.shape), "out_shape": list(e.out_shape)}
                for e in self.events]

    @classmethod
    def from_list(cls, items: list[dict]) -> "CollectiveRecord":
        return cls([CollectiveEvent(**{**d, "shape": tuple(d["shape"]),
                                       "out_shape": tuple(d["out_shape"])}) for d in items])


# The records being filled on this rank process. A plain list rather than a ContextVar because
# autograd may run backward functions on a worker thread, where a ContextVar set here is unset.
_ACTIVE: list[CollectiveRecord] = []


@contextlib.contextmanager
def record(keep_tensors: bool = False) -> Iterator[CollectiveRecord]:
    """Record every region operation issued on this rank inside the block (nesting allowed)."""
    rec = CollectiveRecord(keep_tensors=keep_tensors)
    _ACTIVE.append(rec)
    try:
        yield rec
    finally:
        _ACTIVE.remove(rec)


def _sent_bytes(op: str, nbytes: int, out_bytes: int, t: int) -> int:
    if op == "all_reduce":
        return 2 * (t - 1) * nbytes // t
    if op == "all_gather":
        return (t - 1) * nbytes
    if op == "reduce_scatter":
        # t-1 ring steps, each passing one chunk the size of this rank's output: exact, where
        # (t-1) * nbytes // t would round down whenever nbytes is not a multiple of t
        return (t - 1) * out_bytes
    return 0


def note(op: str, x: torch.Tensor, out: torch.Tensor, region: str, operator: str,
          direction: str, t: int, sent: int | None = None, seconds: float | None = None) -> None:
    nbytes = x.numel() * x.element_size()
    out_bytes = out.numel() * out.element_size()
    event = CollectiveEvent(op, region, operator, direction, tuple(x.shape), tuple(out.shape),
                            str(x.dtype).replace("torch.", ""), nbytes,
                            _sent_bytes(op, nbytes, out_bytes, t) if sent is None else sent, t,
                            seconds)
    for rec in _ACTIVE:
        rec.events.append(event)
        rec.tensors.append((x.detach().clone(), out.detach().clone()) if rec.keep_tensors else None)
