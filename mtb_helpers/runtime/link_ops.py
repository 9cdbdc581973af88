"""The torch.distributed functions a rank calls under an emulated link, each taking its modelled time.

``install(emulation)`` replaces the public collective and point-to-point functions in
``torch.distributed`` (and in ``distributed_c10d``, so ``P2POp`` and ``batch_isend_irecv`` accept
them and the object collectives use them) for the duration of one call; it returns ``restore``.
What each replacement does, on the rank's comm stream (``comm_thread.CommStream``), in issue order:

* a collective: the group's ranks first agree, with a two-number all-reduce (MAX) of their
  ready times and modelled times: the transfer starts when the last rank was ready, and its
  modelled time is the slowest rank's (an uneven all-to-all takes its largest send buffer's time). Then
  the real gloo op runs (the result is gloo's, exactly as without a link) and the stream sleeps
  until start + modelled. ``async_op=True`` returns at once with a handle; the rank computes
  meanwhile. ``reduce`` costs what ``broadcast`` does (its mirror image); ``gather`` and
  ``scatter`` what the ring all-gather does (the root's link carries (p-1)/p of S in p-1
  messages); ``barrier`` is an all-reduce of 0 bytes.
* a message (``send``/``isend``/``recv``/``irecv``): posted on the stream without blocking it
  (a link is full-duplex, and gloo's isend/irecv pairs must not wait on each other). The sender
  sends a 3-number header ``[start, modelled, sender]`` before the payload; the receiver's
  ``wait()`` returns at the sender's start + modelled, on the clock every rank of this machine
  shares (CLOCK_MONOTONIC). Each rank has one outgoing and one incoming link: its sends leave
  one after another, and messages arriving together are received one after another (in the
  order the rank waits for them), so a root that talks to p-1 ranks pays p-1 messages.

Anything a rank issues without these functions (PyTorch's DDP, DTensor and FSDP2 call C++
directly) is not emulated and takes this machine's time.
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
from mtb_helpers.runtime.timeline import Event

__all__ = ["install", "COLLECTIVE_OPS", "P2P_OPS", "ORIG", "sleep_until"]


def _b(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


# name -> (the model's collective, nccl-tests' S from the bound arguments and the group size p)
COLLECTIVE_OPS: dict[str, tuple[str, Callable[[dict, int], int]]] = {
    "all_reduce": ("all-reduce", lambda a, p: _b(a["tensor"])),
    "broadcast": ("broadcast", lambda a, p: _b(a["tensor"])),
    "reduce": ("broadcast", lambda a, p: _b(a["tensor"])),
    "all_gather": ("all-gather", lambda a, p: sum(map(_b, a["tensor_list"]))),
    "all_gather_into_tensor": ("all-gather", lambda a, p: _b(a["output_tensor"])),
    "all_gather_single": ("all-gather", lambda a, p: _b(a["output_tensor"])),
    "reduce_scatter": ("reduce-scatter", lambda a, p: sum(map(_b, a["input_list"]))),
    "reduce_scatter_tensor": ("reduce-scatter", lambda a, p: _b(a["input"])),
    "reduce_scatter_single": ("reduce-scatter", lambda a, p: _b(a["input"])),
    "all_to_all": ("all-to-all", lambda a, p: sum(map(_b, a["input_tensor_list"]))),
    "all_to_all_single": ("all-to-all", lambda a, p: _b(a["input"])),
    "gather": ("all-gather", lambda a, p: p * _b(a["tensor"])),
    "scatter": ("all-gather", lambda a, p: p * _b(a["tensor"])),
    "barrier": ("all-reduce", lambda a, p: 0),
}
P2P_OPS = ("send", "recv", "isend", "irecv")
# run as they are, after the stream has drained: their own traffic goes through the functions above
DRAINED = ("monitored_barrier",)
ORIG: dict[str, Callable] = {n: getattr(c10d, n) for n in (*COLLECTIVE_OPS, *P2P_OPS, *DRAINED)
                             if hasattr(c10d, n)}


def sleep_until(deadline: float) -> None:
    """Sleep (no CPU) until ``time.perf_counter()`` reaches ``deadline``, a day at a time at
    most: one sleep of 1e10 s overflows the platform's time_t (OverflowError)."""
    while (remaining := deadline - time.perf_counter()) > 0:
        time.sleep(min(remaining, 86400.0))


def _named(fn: Callable, name: str) -> Callable:
    # the stack dump of a blocked rank then names the collective, as torch's own function would
    fn.__code__ = fn.__code__.replace(co_name=name, co_qualname=name)
    fn.__name__ = fn.__qualname__ = name
    return fn


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
    call()
    sleep_until(start + modelled)
    em.free_at = start + modelled
    em.events.append(Event("comm", name, nbytes, start, time.perf_counter(), modelled))


def _collective(em: Any, name: str) -> Callable:
    orig, (collective, size_of) = ORIG[name], COLLECTIVE_OPS[name]
    signature = inspect.signature(orig)

    def op(*args, **kwargs):
        if em.bypass():
            return orig(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        group = bound.arguments.get("group")
        if c10d._rank_not_in_group(group):
            return orig(*args, **kwargs)     # torch warns and returns, as without a link
        async_op = bound.arguments.get("async_op", False)
        bound.arguments["async_op"] = False
        p = dist.get_world_size(group)
        nbytes = size_of(bound.arguments, p)
        handle = em.stream.submit(partial(_run_collective, em, name, collective, nbytes, p, group,
                                          time.perf_counter(),
                                          partial(orig, *bound.args, **bound.kwargs)))
        if async_op:
            return handle
        handle.wait()
        return None

    return _named(op, name)


class P2PHandle(Handle):
    """An emulated isend/irecv: posted on the stream, completed by ``wait()`` at the modelled
    arrival (the sender's start + its modelled time). ``source_rank()`` after a receive."""

    def __init__(self, em: Any, sending: bool, arguments: dict):
        super().__init__()
        self.em, self.sending, self.a = em, sending, arguments
        self.tensor: torch.Tensor = arguments["tensor"]
        self.finished = False
        self._lock = threading.Lock()
        self.issued = time.perf_counter()
        self.posted = em.stream.submit(self._post)
        em.p2p.append(self)

    def _peer(self, src: int | None = None) -> dict:
        keys = ("dst", "group_dst") if self.sending else ("src", "group_src")
        peer = {k: self.a[k] for k in keys if self.a.get(k) is not None}
        return {"src": src} if src is not None else peer

    def _post(self) -> None:
        group, tag = self.a.get("group"), self.a.get("tag", 0)
        self.posted_at = max(self.issued, self.em.free_at)   # after the stream's earlier ops
        if self.sending:
            # one outgoing link: a rank's messages leave one after another (a root sending to
            # p-1 ranks pays p-1 messages), while a send and a receive overlap (full duplex)
            self.start = max(self.posted_at, self.em.out_free)
            self.modelled = self.em.modelled("send/recv", _b(self.tensor), 2)
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
                self.em.events.append(Event("comm", "send" if self.sending else "recv",
                                            _b(self.tensor), self.start,
                                            arrival if late else time.perf_counter(),
                                            self.modelled))
                self.finished = True
                self._finish(True)
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


def _p2p(em: Any, name: str) -> Callable:
    orig = ORIG[name]
    signature = inspect.signature(orig)
    sending, blocking = name in ("send", "isend"), name in ("send", "recv")

    def op(*args, **kwargs):
        if em.bypass():
            return orig(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        if c10d._rank_not_in_group(bound.arguments.get("group")):
            return orig(*args, **kwargs)
        handle = P2PHandle(em, sending, dict(bound.arguments))
        if not blocking:
            return handle
        handle.wait()
        return None if sending else handle.source

    return _named(op, name)


def _drained(em: Any, name: str) -> Callable:
    orig = ORIG[name]

    def op(*args, **kwargs):
        if not em.bypass():
            em.stream.drain()
        return orig(*args, **kwargs)

    return _named(op, name)


def install(em: Any) -> Callable[[], None]:
    """Replace the functions in ``torch.distributed`` and ``distributed_c10d``; return restore."""
    saved = [(module, name, getattr(module, name)) for module in (dist, c10d) for name in ORIG
             if hasattr(module, name)]
    for name in ORIG:
        maker = _collective if name in COLLECTIVE_OPS else _p2p if name in P2P_OPS else _drained
        replacement = maker(em, name)
        for module in (dist, c10d):
            if hasattr(module, name):
                setattr(module, name, replacement)

    def restore() -> None:
        for module, name, fn in saved:
            setattr(module, name, fn)

    return restore
