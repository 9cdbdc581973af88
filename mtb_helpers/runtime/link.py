"""Emulated links on real ranks: ``run(fn, world_size=4, link=Link(5e-6, 50e9), time_scale=100)``.

Inside the call every collective and message a rank issues through ``torch.distributed`` (the
student's own code included) runs on the rank's comm stream and takes the link's modelled time
(:mod:`mtb_helpers.runtime.link_ops`); ``with padded("fc1.fwd", seconds):`` gives a block of
computation a modelled time too, so a timeline follows the model, not this machine's cores.
Results are gloo's, unchanged: a link changes when things finish, never what they compute.

``time_scale=N`` multiplies every modelled time by N, keeping their ratios: a link faster than
gloo here (the ``Floor``) is refused naming the smallest N that works (``time_scale="auto"``
picks it). An operation the link would end after the call's timeout raises, at once, a
RankTimeoutError naming the link. The caller gets ``RunResults`` with ``.timeline``
(:mod:`mtb_helpers.runtime.timeline`). The link is duck-typed (``alpha``, ``bandwidth``,
``time(collective, nbytes, p)``, ``describe()``): the runtime imports no topic.
"""
from __future__ import annotations

import contextlib
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from mtb_helpers.runtime import link_ops
from mtb_helpers.runtime.comm_thread import CommStream
from mtb_helpers.runtime.errors import (LinkTimeout, RankError, RankTimeoutError,
                                        link_timeout_message, too_slow)
from mtb_helpers.runtime.timeline import LinkEvent, RunResults, LinkTimeline

__all__ = ["padded", "pad_backward", "validate_link", "measure_floor", "Floor", "run_linked", "LinkedCall",
           "active_time_scale", "unmodelled", "comm_seconds", "FLOOR_REFRESH"]

OVERRUN_WARNING = 2e-3   # seconds beyond the model before the caller is told the machine lagged
FLOOR_REFRESH = 10.0     # seconds: the floor is measured again after an overrun, at most this often

_ACTIVE: "LinkedCall | None" = None   # the linked call running on this rank, if any


class LinkedCall:
    """What a rank runs for ``run(fn, ..., link=...)``: ``fn`` under the emulated link, returning
    ``{"result", "events", "zero"}`` (``__wrapped__`` lets the owner find ``fn``'s source). On the
    rank it is the call's emulation too: the comm stream, the events, the owner's ``deadline``
    (``time.perf_counter()``: all processes here share that clock)."""

    def __init__(self, fn: Callable, link: Any, time_scale: float, deadline: float = math.inf):
        self.__wrapped__ = fn
        self.link, self.scale, self.deadline = link, time_scale, deadline

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        global _ACTIVE
        self.events: list[LinkEvent] = []
        self.p2p: list = []
        self.free_at = 0.0   # when the stream's last collective ends (perf_counter seconds)
        self.out_free = self.in_free = 0.0   # when this rank's outgoing / incoming link is free
        self.stream = CommStream()
        self.direct: threading.Thread | None = None   # a thread inside unmodelled()
        restore = link_ops.install(self)
        _ACTIVE = self
        try:
            if dist.get_world_size() > 1:
                link_ops.ORIG["barrier"]()   # one zero for every rank's clock
            zero = time.perf_counter()
            result = self.__wrapped__(*args, **kwargs)
            self.finish()
            return {"result": result, "events": self.events, "zero": zero}
        finally:
            _ACTIVE = None
            restore()
            self.stream.close()

    def modelled(self, collective: str, nbytes: int, p: int) -> float:
        seconds = self.link.time(collective, nbytes, p) * self.scale
        # past the owner's deadline: say so now (sleeping into its timeout would look like a hang)
        if max(time.perf_counter(), self.free_at) + seconds > self.deadline:
            raise LinkTimeout(f"{collective} of {nbytes} B on {p} ranks takes {seconds / self.scale:.3g}"
                              f" s of modelled time on the emulated link ({self.link.describe()}),"
                              f" x time_scale {self.scale:g}")
        return seconds

    def bypass(self) -> bool:
        """True on the stream's own thread (its real ops must not be emulated twice) and inside
        :func:`unmodelled` on the thread that entered it."""
        return threading.current_thread() in (self.stream.thread, self.direct)

    def finish(self) -> None:
        """Wait for every queued operation; complete the messages that have arrived."""
        self.stream.drain()
        for handle in self.p2p:
            if not handle.finished and handle.is_completed():
                handle.wait()


def active_time_scale() -> float:
    """The time scale of the emulated link this rank runs under (1.0 without one)."""
    return _ACTIVE.scale if _ACTIVE is not None else 1.0


@contextlib.contextmanager
def unmodelled() -> Iterator[None]:
    """The block's collectives run at gloo's speed, outside the link's model and timeline: for an
    agreement that moves none of the step's data (context parallelism's check of shard shapes),
    which the α-β prediction leaves out. The stream is drained first (one order on every rank)."""
    em = _ACTIVE
    if em is None or em.direct is not None:
        yield
        return
    em.finish()
    em.direct = threading.current_thread()
    try:
        yield
    finally:
        em.direct = None


def comm_seconds(since: float) -> float:
    """Seconds after ``since`` (a ``time.perf_counter()`` reading) in which this rank's emulated
    collectives or received messages were under way (0 without a link), overlaps counted once;
    sends leave beside the computation and are left out. A block that computes and communicates
    (a TP layer, a ring attention) is padded with it to the α-β sum of compute and communication."""
    em = _ACTIVE
    if em is None:
        return 0.0
    spans = sorted((max(e.start, since), e.end) for e in em.events
                   if e.kind == "comm" and e.name not in ("send", "isend") and e.end > since)
    total, reached = 0.0, since
    for start, end in spans:     # the union of the intervals
        if end > reached:
            total += end - max(start, reached)
            reached = end
    return total


@contextlib.contextmanager
def padded(name: str, seconds: float) -> Iterator[None]:
    """Make the block take ``seconds`` (x the time scale under a link), like a GPU kernel of fixed
    duration; under a link it is recorded as a ``"compute"`` event named ``name``. A block that
    already took longer is not shortened (its event shows the overrun)."""
    check_number(seconds, f"padded({name!r}): seconds must be finite and >= 0", positive=False)
    em = _ACTIVE
    modelled = seconds * (em.scale if em is not None else 1.0)
    start = time.perf_counter()
    yield
    link_ops.sleep_until(start + modelled)
    if em is not None:
        em.events.append(LinkEvent("compute", name, 0, start, time.perf_counter(), modelled))


class _PadBackward(torch.autograd.Function):
    """Identity forward; backward takes ``seconds`` of padded compute named ``name``."""

    @staticmethod
    def forward(ctx, x, name, seconds):
        ctx.name, ctx.seconds = name, seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        with padded(ctx.name, ctx.seconds):
            pass
        return grad, None, None


def pad_backward(x: torch.Tensor, name: str, seconds: float) -> torch.Tensor:
    """``x`` unchanged; in backward, before the grad flows on to what produced ``x``, a padded
    compute block of ``seconds`` named ``name`` (put it after a layer: its backward's time)."""
    check_number(seconds, f"pad_backward({name!r}): seconds must be finite and >= 0", positive=False)
    return _PadBackward.apply(x, name, seconds)


def check_number(value: object, must: str, positive: bool = True) -> None:
    """ValueError ``"<must>, got <value>"`` unless ``value`` is a finite number >= 0 (> 0 if
    ``positive``): the runtime's one check of a timeout, a time scale or a padded time."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (positive and value == 0):
        raise ValueError(f"{must}, got {value!r}")


def validate_link(link: Any, time_scale: object) -> None:
    """ValueError before any rank starts: not a link, a time scale that is neither "auto" nor
    a finite number > 0, or one that stretches a message (α) or a byte (1/β) past a year."""
    if not all(hasattr(link, a) for a in ("alpha", "bandwidth", "time", "describe")):
        raise ValueError(f"link must be a Link(alpha, bandwidth) from mtb_helpers.cost, got {link!r}")
    if time_scale == "auto":
        return
    check_number(time_scale, "time_scale must be a finite number > 0")
    if problem := too_slow(link.alpha, link.bandwidth, time_scale):
        raise ValueError(f"time_scale={time_scale:g} with {problem}")


@dataclass(frozen=True)
class Floor:
    """What gloo needs here at best: ``latency`` s per emulated collective (agreement + tiny op),
    ``bandwidth`` B/s (busbw of a 1 MiB all-reduce), measured at ``time.monotonic()`` ``measured_at``."""
    latency: float
    bandwidth: float
    measured_at: float = 0.0

    def need(self, link: Any) -> float:
        """The time scale ``link`` needs here, with a 1.5x margin for a busier moment."""
        return 1.5 * max(self.latency / link.alpha, link.bandwidth / self.bandwidth)

    def smallest_scale(self, link: Any) -> float:
        """The smallest scale of 1, 2, 5, 10, 20, ... honouring ``link`` with a 1.5x margin."""
        scale = 1.0
        while scale < self.need(link):
            scale *= 2.5 if str(int(scale)).startswith("2") else 2.0
        return scale

    def refusal(self, link: Any, time_scale: float) -> str | None:
        """Why ``link`` at ``time_scale`` cannot be emulated honestly here, or None."""
        alpha, beta = link.alpha * time_scale, link.bandwidth / time_scale
        if alpha >= self.latency and beta <= self.bandwidth:
            return None
        need = float(f"{self.need(link):.1g}")   # rounded
        return (f"link={link!r} cannot be emulated at time_scale={time_scale:g}: at that scale "
                f"α = {alpha * 1e6:.3g} µs and β = {beta / 1e9:.3g} GB/s, but gloo on this "
                f"machine needs {self.latency * 1e6:.0f} µs per collective and moves at most "
                f"{self.bandwidth / 1e9:.3g} GB/s. Use time_scale >= {need:g} (every modelled "
                "time stretched by that factor, ratios kept) or a slower link.")


def _probe() -> tuple[float, float]:
    """On every rank, no link: the time of (agreement + a tiny all-reduce), and of a 1 MiB one."""
    all_reduce, barrier = link_ops.ORIG["all_reduce"], link_ops.ORIG["barrier"]
    tiny, big = torch.zeros(1, dtype=torch.float64), torch.zeros(2**18)
    small, large = [], []
    for i in range(9):
        barrier()
        t0 = time.perf_counter()
        all_reduce(tiny, op=dist.ReduceOp.MAX)
        all_reduce(tiny)
        small.append(time.perf_counter() - t0)
        if i % 3 == 0:
            barrier()
            t0 = time.perf_counter()
            all_reduce(big)
            large.append(time.perf_counter() - t0)
    # the best case: a busy moment costs more, reported as an overrun, not refused in advance
    return min(small[2:]), min(large)


def measure_floor(pool: Any, timeout: float) -> Floor:
    """The pool's floor, measured on its first linked call and again after a call that overran
    its model (at most every FLOOR_REFRESH s): refusals follow the machine as it is now."""
    if pool.link_floor is None:
        p = pool.world_size
        replies = pool.call(_probe, (), {}, timeout)
        latency = max(r[0] for r in replies)
        big = max(r[1] for r in replies)
        busbw = 2 * (p - 1) / p * 2**20 / max(big - latency / 2, 1e-6)
        pool.link_floor = Floor(latency, busbw, time.monotonic())
    return pool.link_floor


def run_linked(pool: Any, fn: Callable, args: tuple, kwargs: dict, timeout: float, link: Any,
               time_scale: float) -> RunResults:
    """``pool.call`` under ``link`` (the floor checked first); results with their timeline."""
    if time_scale == "auto":   # the smallest stretch this machine can honour right now
        time_scale = measure_floor(pool, timeout).smallest_scale(link) if pool.world_size > 1 else 1.0
    elif pool.world_size > 1:
        problem = measure_floor(pool, timeout).refusal(link, time_scale)
        if problem:
            raise ValueError(problem)
    try:
        replies = pool.call(LinkedCall(fn, link, time_scale, time.perf_counter() + timeout),
                            args, kwargs, timeout)
    except RankError as exc:   # the link, not a hang, would have run the call past its timeout
        if exc.exc_type != LinkTimeout.__name__:
            raise
        raise RankTimeoutError(link_timeout_message(exc, timeout), [], {}) from None
    zero = min(r["zero"] for r in replies)
    ranks = [[LinkEvent(e.kind, e.name, e.bytes, e.start - zero, e.end - zero, e.modelled)
              for e in r["events"]] for r in replies]
    timeline = LinkTimeline(ranks, link, float(time_scale))
    late = [e for e in timeline.events() if e.overrun > OVERRUN_WARNING]
    if late:   # the machine may be busier than when the floor was measured
        if pool.link_floor and time.monotonic() - pool.link_floor.measured_at >= FLOOR_REFRESH:
            pool.link_floor = None
        worst = max(late, key=lambda e: e.overrun)
        print(f"[mtb] emulated link: {len(late)} of {len(timeline.events())} operations took "
              f"longer than modelled (worst: {worst.name}, {worst.seconds * 1e3:.1f} ms for "
              f"{worst.modelled * 1e3:.1f} ms modelled): this machine did not keep up; a larger "
              "time_scale or a slower link gives honest times.", flush=True)   # for the student: not an error
    return RunResults([r["result"] for r in replies], timeline)
