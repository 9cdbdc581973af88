"""The record of every collective a rank issued: what, where, which way, how many bytes.

Inside ``with record() as rec:`` every ``torch.distributed`` collective and message this rank
issues is appended to ``rec`` as a ``CollectiveEvent``, in issue order, forward and backward alike.
It observes ``torch.distributed`` from below (``runtime/link_ops.add_observer``), so a student's
own ``dist.all_reduce`` is recorded like the course's. A call in the ``forward`` or ``backward`` of
an autograd Function registered with ``@recorded(region, operator)`` (``comm/regions.py``) carries
that region, operator and direction; any other has none unless its code names it (``note``). Calls
torch makes inside its own functions (``all_gather_object``'s) are not recorded; a region's local
split is (``local_split``, 0 bytes sent), so a step trace can show where the layout changed.
Records are plain data: a check returns them from its ranks, a notebook compares them with the
formulas.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import time
from dataclasses import asdict, dataclass, field
from types import CodeType
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from mtb_helpers.runtime.link_ops import OPS, add_observer, signature
from mtb_helpers.runtime.link_ops import tensor_bytes as _bytes


@dataclass(frozen=True)
class CollectiveEvent:
    """One torch.distributed operation (or a region's local split) this rank issued.

    ``shape``/``bytes``: the tensor handed to the operation; ``out_shape``: the one it got back (a
    list of ``t`` tensors, as ``dist.all_gather`` fills, reads ``[t, ..]``). ``sent_bytes``: what
    this rank sends with the usual ring algorithm, ``t`` = ``group_size``, N = ``bytes``: all-reduce
    2(t-1)/t N, all-gather (t-1) N, reduce-scatter (t-1) N_out = (t-1)/t N (N_out: the chunk it
    keeps; gloo's own reduce-scatter is an all-reduce inside and sends more, notebook 00 measures
    it), all-to-all the rows addressed to the other ranks, split 0 (local), send N, recv 0,
    broadcast and scatter (t-1) N at the root, reduce and gather N from every other rank, barrier 0.
    """
    op: str
    region: str
    operator: str        # which use of the region: the paper's operator ("f", "g"), the parameter
                         # whose grad is all-reduced ("ln.weight", "gate.weight"), a re-gather in
                         # backward ("re-gather"), or "" when nothing more needs saying
    direction: str       # "forward" or "backward"; "" outside a registered region
    shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    dtype: str
    bytes: int
    sent_bytes: int
    group_size: int
    # how long the call took (a time, not what was sent); None for an ``async_op=True`` call,
    # whose return is its launch, not its end (time it at its handle's ``wait()``)
    seconds: float | None = field(default=None, compare=False)

    def describe(self) -> str:
        """E.g. ``'forward all_reduce (g) [6, 8] float32: 192 B in, 192 B sent'``."""
        name = f"{self.op} ({self.operator})" if self.operator else self.op
        where = f"{self.direction} " if self.direction else ""
        return (f"{where}{name} {list(self.shape)} {self.dtype}: "
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
        forward and backward always appear; other directions (a ``step``, ``""`` outside a region)
        when used."""
        parts = []
        for direction in dict.fromkeys(["forward", "backward", *(e.direction for e in self)]):
            counts: dict[str, list[int]] = {}
            for e in self.communicating():
                if e.direction == direction:
                    n, b = counts.get(e.op, [0, 0])
                    counts[e.op] = [n + 1, b + e.bytes]
            text = ", ".join(f"{n} {op} ({b} B)" for op, (n, b) in counts.items()) or "nothing"
            parts.append(f"{direction or 'outside a region'}: {text}")
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


# The records being filled on this rank process: a plain list, not a ContextVar (autograd may run
# backward functions on a worker thread, where a ContextVar set here is unset).
_ACTIVE: list[CollectiveRecord] = []
# forward/backward code of each registered autograd Function -> (region, operator, direction)
_LABELS: dict[CodeType, tuple[str, str, str]] = {}


@contextlib.contextmanager
def record(keep_tensors: bool = False) -> Iterator[CollectiveRecord]:
    """Record every torch.distributed call this rank issues inside the block (nesting allowed)."""
    rec = CollectiveRecord(keep_tensors=keep_tensors)
    stop = None if _ACTIVE else add_observer(_observe)   # the outermost record observes
    _ACTIVE.append(rec)
    try:
        yield rec
    finally:
        _ACTIVE.remove(rec)
        if stop is not None:
            stop()


def recorded(region: str, operator: str = "") -> Callable[[type], type]:
    """Class decorator of an autograd Function: the collectives its ``forward`` and ``backward``
    issue are recorded under ``region``, ``operator`` and that direction. A Function whose uses
    differ (one parameter's grad or another's) sets ``ctx.region`` / ``ctx.operator`` instead."""
    def register(cls: type) -> type:
        cls.region, cls.operator = region, operator
        for direction in ("forward", "backward"):
            _LABELS[getattr(cls, direction).__code__] = (region, operator, direction)
        return cls
    return register


_params = functools.cache(lambda name: tuple(signature(name).parameters))   # argument names


def _label(frame: Any) -> tuple[str, str, str] | None:
    """(region, operator, direction) of the nearest registered Function on the stack, if any;
    None when torch issued the call inside one of its own functions (not recorded)."""
    while frame is not None and frame.f_globals.get("__name__") in (__name__, add_observer.__module__):
        frame = frame.f_back
    if frame is None or frame.f_globals.get("__name__", "").startswith("torch."):
        return None
    for _ in range(8):   # a region calls torch.distributed itself: its frame is near
        label = _LABELS.get(frame.f_code)
        if label is not None:
            ctx = frame.f_locals.get("ctx")
            return (getattr(ctx, "region", label[0]), getattr(ctx, "operator", label[1]), label[2])
        frame = frame.f_back
        if frame is None:
            break
    return "", "", ""


def _flat(x: Any) -> torch.Tensor:
    """A tensor argument as one tensor: a list of ``t`` of them stacked, ``[t, ..]`` (none: empty)."""
    return x if isinstance(x, torch.Tensor) else torch.stack(list(x)) if x else torch.empty(0)


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(x.shape) if isinstance(x, torch.Tensor) else (len(x), *x[0].shape) if x else ()


def local_split(x: torch.Tensor, out: torch.Tensor, t: int) -> None:
    """Record the local split ``x`` -> ``out`` of the region on the stack: no communication (0 bytes
    sent), recorded so that a step trace can show where the layout changed."""
    label = _label(inspect.currentframe()) if _ACTIVE and dist.is_initialized() else None
    if label:
        _append(CollectiveEvent("split", *label, tuple(x.shape), tuple(out.shape),
                                str(x.dtype).replace("torch.", ""), _bytes(x), 0, t),
                (x.detach().clone(), out.detach().clone()) if any(r.keep_tensors for r in _ACTIVE) else None)


def _observe(name: str, args: tuple, kwargs: dict) -> Callable[[Any], None] | None:
    """The observer: before the call, what to append to every active record once it returned."""
    label = _label(inspect.currentframe()) if _ACTIVE and name != "monitored_barrier" else None
    if label is None:
        return None
    a = {**dict(zip(_params(name), args)), **kwargs}   # the arguments by name (bind() is 5x slower)
    op, src, dst, _ = OPS[name]
    x, out = a.get(src), a.get(dst)
    before = _flat(x).detach().clone() if any(r.keep_tensors for r in _ACTIVE) else None
    started = time.perf_counter()

    def done(result: Any) -> None:
        seconds = None if a.get("async_op") else time.perf_counter() - started
        group = a.get("group")
        nbytes, t = _bytes(x), dist.get_world_size(group)
        me = dist.get_rank(group) if op in ("all_to_all", "broadcast", "scatter", "reduce", "gather") else 0
        sent = _sent_bytes(op, nbytes, _bytes(out), t)
        if op == "all_to_all":   # all but the rows (or the tensor) this rank keeps
            rows = _shape(x)[0] if name == "all_to_all_single" and _shape(x) else 0
            own = (a.get("input_split_sizes") or [rows // t] * t)[me] * (nbytes // rows) if rows \
                else _bytes(x[me]) if name == "all_to_all" else 0
            sent = nbytes - own
        elif op in ("broadcast", "scatter"):
            sent = (t - 1) * _bytes(out if op == "scatter" else x) if me == a.get("src", 0) else 0
        elif op in ("reduce", "gather"):
            sent = nbytes if me != a.get("dst", 0) else 0
        tensors = (before, _flat(out).detach().clone()) if before is not None else None
        _append(CollectiveEvent(op, *label[:2], label[2], _shape(x), _shape(out),
                                str(_flat(x).dtype).replace("torch.", ""), nbytes, sent, t, seconds),
                tensors)

    return done


def _append(event: CollectiveEvent, tensors: tuple[torch.Tensor, torch.Tensor] | None) -> None:
    for rec in _ACTIVE:
        rec.events.append(event)
        rec.tensors.append(tensors if rec.keep_tensors else None)


def _sent_bytes(op: str, nbytes: int, out_bytes: int, t: int) -> int:
    if op == "all_reduce":
        return 2 * (t - 1) * nbytes // t
    if op == "all_gather":
        return (t - 1) * nbytes
    if op == "reduce_scatter":
        # t-1 ring steps, each passing one chunk the size of this rank's output: exact, where
        # (t-1) * nbytes // t would round down whenever nbytes is not a multiple of t
        return (t - 1) * out_bytes
    return nbytes if op == "send" else 0


def note(op: str, x: torch.Tensor, out: torch.Tensor, region: str, operator: str,
         direction: str, t: int, sent: int | None = None, seconds: float | None = None,
         issued_bytes: int | None = None) -> None:
    """Name the collective this code just issued outside a registered region: the latest unnamed
    event of ``op`` on ``issued_bytes`` (``x``'s) moves to the end as this description (one that
    never reached torch.distributed, e.g. a message to itself, is added)."""
    nbytes = x.numel() * x.element_size()
    match = nbytes if issued_bytes is None else issued_bytes
    for rec in _ACTIVE:
        found = next((i for i in range(len(rec.events) - 1, -1, -1) if rec.events[i].region == ""
                      and rec.events[i].op == op and rec.events[i].bytes == match), None)
        took = None if found is None else (rec.events.pop(found).seconds, rec.tensors.pop(found))[0]
        rec.events.append(CollectiveEvent(
            op, region, operator, direction, tuple(x.shape), tuple(out.shape),
            str(x.dtype).replace("torch.", ""), nbytes,
            _sent_bytes(op, nbytes, out.numel() * out.element_size(), t) if sent is None else sent,
            t, seconds if seconds is not None else took))
        rec.tensors.append((x.detach().clone(), out.detach().clone()) if rec.keep_tensors else None)
