"""The one interception point of torch.distributed on a rank, and the emulated link that uses it.

While something observes them (a record, an emulated link), the public collective and
point-to-point functions of ``torch.distributed`` (and of ``distributed_c10d``, so ``P2POp`` and
the object collectives use them too) are wrappers: each call goes to the observers
(``add_observer``: the records, ``comm/records.py``), then to the emulated link (``install``),
and ends in the function that was in place before (torch's, or a test's). With neither, the
functions are torch's own. A lesson's ``dist.all_reduce`` and a student's are observed alike;
the runtime's own traffic calls ``ORIG``, torch's functions as imported, and is neither.

Under an emulated link each call runs on the rank's comm stream (``comm_thread.CommStream``), in
issue order. A collective's ranks agree on its start and modelled time (``_run_collective``), gloo
runs it (the result is gloo's, exactly as without a link) and the stream sleeps to the modelled
end; ``async_op=True`` returns a handle at once. ``reduce`` costs what ``broadcast`` does (its
mirror image); ``gather`` and ``scatter`` what the ring all-gather does (the root's link carries
(p-1)/p of S in p-1 messages); ``barrier`` is an all-reduce of 0 bytes. A message is posted
without blocking the stream (a link is full-duplex, and gloo's isend/irecv pairs must not wait on
each other) and arrives at the sender's start + its modelled time (``P2PHandle``).

What a rank issues without them (DDP, DTensor and FSDP2 call C++) is neither emulated nor recorded.
"""
from __future__ import annotations

import inspect
import threading
import time
from functools import partial
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from mtb_helpers.runtime.comm_thread import Handle
from mtb_helpers.runtime.timeline import LinkEvent

__all__ = ["add_observer", "signature", "install", "OPS", "model_bytes", "tensor_bytes", "ORIG",
           "sleep_until"]


def tensor_bytes(x: Any) -> int:
    """Bytes of a tensor argument: one tensor, a list of them (summed), or None (0)."""
    return sum(t.numel() * t.element_size() for t in ([x] if isinstance(x, torch.Tensor) else x or ()))


# torch's function -> (the record's op, its input and output arguments, the α-β model's collective)
OPS: dict[str, tuple[str, str, str, str]] = {
    "all_reduce": ("all_reduce", "tensor", "tensor", "all-reduce"),
    "broadcast": ("broadcast", "tensor", "tensor", "broadcast"),
    "reduce": ("reduce", "tensor", "tensor", "broadcast"),
    "all_gather": ("all_gather", "tensor", "tensor_list", "all-gather"),
    "all_gather_into_tensor": ("all_gather", "input_tensor", "output_tensor", "all-gather"),
    "all_gather_single": ("all_gather", "input_tensor", "output_tensor", "all-gather"),
    "reduce_scatter": ("reduce_scatter", "input_list", "output", "reduce-scatter"),
    "reduce_scatter_tensor": ("reduce_scatter", "input", "output", "reduce-scatter"),
    "reduce_scatter_single": ("reduce_scatter", "input", "output", "reduce-scatter"),
    "all_to_all": ("all_to_all", "input_tensor_list", "output_tensor_list", "all-to-all"),
    "all_to_all_single": ("all_to_all", "input", "output", "all-to-all"),
    "gather": ("gather", "tensor", "gather_list", "all-gather"),
    "scatter": ("scatter", "scatter_list", "tensor", "all-gather"),
    "barrier": ("barrier", "", "", "all-reduce"),
    **{n: (n.removeprefix("i"), "tensor", "tensor", "send/recv") for n in ("send", "recv", "isend", "irecv")},
}


def model_bytes(name: str, arguments: dict, p: int) -> int:
    """nccl-tests' size S of a call of ``name`` on ``p`` ranks: the all-gathers' gathered output
    (gather and scatter: p times the one tensor), every other collective's input."""
    op, src, dst, collective = OPS[name]
    if op in ("gather", "scatter"):
        return p * tensor_bytes(arguments["tensor"])
    return tensor_bytes(arguments.get(dst if collective == "all-gather" else src))


P2P_OPS = ("send", "recv", "isend", "irecv")
DRAINED = ("monitored_barrier",)   # runs as it is, once the stream has drained
ORIG: dict[str, Callable] = {n: getattr(c10d, n) for n in (*OPS, *DRAINED) if hasattr(c10d, n)}
_SIGNATURES: dict[str, inspect.Signature] = {}
_HOOKS: list[Callable] = []       # around a call: the emulated link (it runs the call itself)
_OBSERVERS: list[Callable] = []   # before a call, returning what to do after it: the records
_saved: list[tuple[Any, str, Callable]] = []   # what the wrappers replaced, to put back
_WRAPPERS: dict[Callable, Callable] = {}   # one wrapper per function, made once


def signature(name: str) -> inspect.Signature:
    """The signature of torch's ``name`` (to bind a call's arguments by name), computed once."""
    if name not in _SIGNATURES:
        _SIGNATURES[name] = inspect.signature(ORIG[name])
    return _SIGNATURES[name]


def _wrapper(name: str, inner: Callable) -> Callable:
    def op(*args, **kwargs):
        after = [a for a in (observe(name, args, kwargs) for observe in _OBSERVERS) if a]
        # the emulated link runs the call on its stream (one link per call on a rank)
        result = _HOOKS[-1](name, inner, args, kwargs) if _HOOKS else inner(*args, **kwargs)
        for done in after:
            done(result)
        return result

    # a blocked rank's stack dump then names the collective, as torch's own function would
    op.__code__ = op.__code__.replace(co_name=name, co_qualname=name)
    op.__name__ = op.__qualname__ = name
    return op


def _attach(fn: Callable, into: list[Callable]) -> Callable[[], None]:
    """Put ``fn`` into ``into`` until the returned ``remove()``. The first hook or observer puts
    the wrappers in place (one per function: ``dist.isend is c10d.isend`` stays true); removing
    the last puts back what was there."""
    if not _HOOKS and not _OBSERVERS:
        _saved[:] = [(m, n, getattr(m, n)) for m in (dist, c10d) for n in ORIG if hasattr(m, n)]
        for module, name, inner in _saved:
            if inner not in _WRAPPERS:
                _WRAPPERS[inner] = _wrapper(name, inner)
            setattr(module, name, _WRAPPERS[inner])
    into.append(fn)

    def remove() -> None:
        into.remove(fn)
        if not _HOOKS and not _OBSERVERS:
            for module, name, was in _saved:
                setattr(module, name, was)
            _saved.clear()

    return remove


def add_observer(observe: Callable[[str, tuple, dict], Callable[[Any], None] | None]) -> Callable[[], None]:
    """``observe(name, args, kwargs)`` before every call of ``ORIG``'s names; what it returns (if
    anything) is called with the call's result once it returned. Its frames are not on the stack
    while the call runs, so a blocked rank is reported at the line that called torch."""
    return _attach(observe, _OBSERVERS)


def sleep_until(deadline: float) -> None:
    """Sleep (no CPU) until ``time.perf_counter()`` reaches ``deadline``, a day at a time at
    most: one sleep of 1e10 s overflows the platform's time_t (OverflowError)."""
    while (remaining := deadline - time.perf_counter()) > 0:
        time.sleep(min(remaining, 86400.0))


def _run_collective(em: Any, name: str, collective: str, nbytes: int, p: int, group: Any,
                    issued: float, call: Callable[[], Any]) -> None:
    """On the stream: agree, run the real op, sleep to the modelled end, record the event.

    A rank is ready when it issued the op or, if the stream was busy, when its previous op ended.
    The ranks all-reduce (MAX) their [ready, modelled]: the transfer starts when the last rank was
    ready and lasts the slowest rank's modelled time, the same instants on every rank however
    late this thread woke up."""
    start, modelled = max(issued, em.free_at), 0.0
    if p > 1:
        agreed = torch.tensor([start, em.modelled(collective, nbytes, p)], dtype=torch.float64)
        ORIG["all_reduce"](agreed, op=dist.ReduceOp.MAX, group=group)
        start, modelled = agreed.tolist()
    with torch.no_grad():   # as on the calling thread inside an autograd Function: gloo writes
        call()              # into views of the output, which autograd must not track
    sleep_until(start + modelled)
    em.free_at = start + modelled
    em.events.append(LinkEvent("comm", name, nbytes, start, time.perf_counter(), modelled))


def _collective(em: Any, name: str, orig: Callable, bound: inspect.BoundArguments):
    """The collective ``name`` queued on the stream; its handle if ``async_op``, else waited for."""
    group = bound.arguments.get("group")
    async_op = bound.arguments.get("async_op", False)
    bound.arguments["async_op"] = False
    p = dist.get_world_size(group)
    handle = em.stream.submit(partial(_run_collective, em, name, OPS[name][3],
                                      model_bytes(name, bound.arguments, p), p, group,
                                      time.perf_counter(), partial(orig, *bound.args, **bound.kwargs)))
    if async_op:
        return handle
    handle.wait()
    return None


class P2PHandle(Handle):
    """An emulated isend/irecv: posted on the stream, completed by ``wait()`` at the modelled
    arrival (the sender's start + its modelled time, sent ahead in a 3-number header, on the clock
    every rank of this machine shares). ``source_rank()`` after a receive."""

    def __init__(self, em: Any, sending: bool, arguments: dict):
        super().__init__()
        self.em, self.sending, self.a = em, sending, arguments
        self.tensor: torch.Tensor = arguments["tensor"]
        self.finished = False
        self._lock = threading.Lock()
        self.issued = time.perf_counter()
        self.posted = em.stream.submit(self._post)
        em.p2p.append(self)

    def _peer(self) -> dict:
        keys = ("dst", "group_dst") if self.sending else ("src", "group_src")
        return {k: self.a[k] for k in keys if self.a.get(k) is not None}

    def _post(self) -> None:
        group, tag = self.a.get("group"), self.a.get("tag", 0)
        self.posted_at = max(self.issued, self.em.free_at)   # after the stream's earlier ops
        if self.sending:
            # one outgoing link: a rank's messages leave one after another (a root sending to
            # p-1 ranks pays p-1 messages), while a send and a receive overlap (full duplex)
            self.start = max(self.posted_at, self.em.out_free)
            self.modelled = self.em.modelled("send/recv", tensor_bytes(self.tensor), 2)
            self.em.out_free = self.start + self.modelled
            header = torch.tensor([self.start, self.modelled, dist.get_rank()], dtype=torch.float64)
            self.works = [ORIG["isend"](t, group=group, tag=tag, **self._peer())
                          for t in (header, self.tensor)]
        else:
            self.header = torch.empty(3, dtype=torch.float64)
            self.works = [ORIG["irecv"](self.header, group=group, tag=tag, **self._peer())]
            if self._peer():  # a known sender: post the payload now (any source: after the header)
                self.works.append(ORIG["irecv"](self.tensor, group=group, tag=tag, **self._peer()))

    def _arrival(self) -> float:
        """The modelled end; for a receive, read from the header (which must have arrived)."""
        if not self.sending and not hasattr(self, "start"):
            sent, self.modelled, source = self.header.tolist()
            self.source = int(source)
            # one incoming link too: messages arriving together are received one after another
            self.start = max(sent, self.em.in_free)
            self.arrival = self.em.in_free = self.start + self.modelled
            if len(self.works) == 1:
                self.works.append(ORIG["irecv"](self.tensor, group=self.a.get("group"),
                                                tag=self.a.get("tag", 0), src=self.source))
        return self.arrival if not self.sending else self.start + self.modelled

    def wait(self, timeout: Any = None) -> bool:
        with self._lock:
            if not self.finished:
                self.posted.wait()
                self.works[0].wait()
                arrival = self._arrival()
                for work in self.works[1:]:
                    work.wait()
                late = time.perf_counter() > arrival   # waited after it had arrived
                sleep_until(arrival)
                self.em.events.append(LinkEvent("comm", "send" if self.sending else "recv",
                                            tensor_bytes(self.tensor), self.start,
                                            arrival if late else time.perf_counter(),
                                            self.modelled))
                self.finished = True
                self._finish()
        return True

    def is_completed(self) -> bool:
        if self.finished:
            return True
        if not self.posted.is_completed() or not self.works[0].is_completed():
            return False
        return self._arrival() <= time.perf_counter() and all(w.is_completed() for w in self.works)

    def source_rank(self) -> int:
        return self.source if not self.sending else dist.get_rank()

    _source_rank = source_rank


def _p2p(em: Any, name: str, bound: inspect.BoundArguments):
    """The message ``name`` posted on the stream; its handle if ``isend``/``irecv``, else waited for
    (``recv`` returns the sender)."""
    bound.apply_defaults()
    sending = name in ("send", "isend")
    handle = P2PHandle(em, sending, dict(bound.arguments))
    if name in ("isend", "irecv"):
        return handle
    handle.wait()
    return None if sending else handle.source


def install(em: Any) -> Callable[[], None]:
    """Emulate every torch.distributed call of this rank under ``em`` until ``restore()``."""
    def hook(name: str, call: Callable, args: tuple, kwargs: dict):
        if em.bypass():    # the comm stream's own ops, or a block inside unmodelled()
            return call(*args, **kwargs)
        if name in DRAINED:
            em.stream.drain()
            return call(*args, **kwargs)
        bound = signature(name).bind(*args, **kwargs)
        if bound.arguments.get("group") == dist.GroupMember.NON_GROUP_MEMBER:   # not a member:
            return call(*args, **kwargs)     # torch warns and returns, as without a link
        if name in P2P_OPS:
            return _p2p(em, name, bound)
        return _collective(em, name, call, bound)

    return _attach(hook, _HOOKS)
