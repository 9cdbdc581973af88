"""Hops around the ring: send a tensor to the next rank, receive the previous rank's.

A ring is written as a generator (``RingAttention.forward_ring``): where it passes a tensor on, it
yields a ``Hop`` and gets back, in its place, the tensor rank ``r-1`` passed on. ``drive`` runs
one ring, or several in lockstep (a check running two layouts at once): in every round the hops
of all the rings travel as **one** message, so two rings cost the synchronising rounds of one
(on one CPU a round of 4 ranks costs milliseconds, whatever the few KiB it carries). A value
yielded that is not a ``Hop`` comes straight back: nothing passed on (a deliberate bug's
missing hop).

Point-to-point (``isend`` / ``irecv``, which gloo runs on CPU tensors), both posted before either
is waited on, so no rank blocks its neighbour. Every hop is noted in the collective record
(``mtb_helpers.comm.records``) as two events, like the pipeline's point-to-point ops: ``"send"``
(``sent_bytes`` = the hop's tensor's bytes) and ``"recv"`` (0 sent), each ring's own hop with its
own bytes whether or not it shared the message. With one rank the hop is the identity and sends
nothing (still noted, 0 bytes), so a record has the same shape at every size.
"""
from __future__ import annotations

import contextlib
import time
from typing import Generator, Iterator, NamedTuple

import torch
import torch.distributed as dist

from mtb_helpers.comm.mesh import group_rank, group_size
from mtb_helpers.comm.records import CollectiveRecord, note, record

__all__ = ["Hop", "drive", "kept_in"]


class Hop(NamedTuple):
    """What a ring yields to pass ``tensor`` to rank r+1 (it gets rank r-1's back)."""
    tensor: torch.Tensor
    region: str
    direction: str


def _global(group: dist.ProcessGroup | None, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


@contextlib.contextmanager
def kept_in(rec: CollectiveRecord | None) -> Iterator[None]:
    """Events noted inside go to every active record as usual, and also to ``rec``."""
    if rec is None:
        yield
        return
    with record() as part:
        yield
    rec.events.extend(part.events)
    rec.tensors.extend([None] * len(part.events))


def _exchange(message: torch.Tensor, cp: int, r: int,
              group: dist.ProcessGroup | None) -> torch.Tensor:
    """``message`` to rank r+1; returns what rank r-1 sent (same shape and dtype)."""
    incoming = torch.empty_like(message)
    requests = [dist.isend(message, dst=_global(group, (r + 1) % cp), group=group),    # [..] -> r+1
                dist.irecv(incoming, src=_global(group, (r - 1) % cp), group=group)]  # [..] <- r-1
    for request in requests:
        request.wait()
    return incoming


def _pass_together(hops: list[Hop], group: dist.ProcessGroup | None,
                   records: list[CollectiveRecord | None]) -> list[torch.Tensor]:
    """Every hop's tensor to rank r+1 in one message; each returned tensor (same shape and dtype
    as its hop's) came from rank r-1."""
    cp, r = group_size(group), group_rank(group)
    sent = [hop.tensor.contiguous() for hop in hops]
    started = time.perf_counter()   # the hop's measured time, in every record
    if cp == 1:
        received = sent
    elif len(sent) == 1:
        received = [_exchange(sent[0], cp, r, group)]
    else:
        # the tensors' bytes end to end, one message [sum of their bytes] uint8; each piece is
        # copied out so that it starts aligned for its dtype
        incoming = _exchange(torch.cat([x.reshape(-1).view(torch.uint8) for x in sent]), cp, r, group)
        pieces = incoming.split([x.numel() * x.element_size() for x in sent])
        received = [piece.clone().view(x.dtype).view(x.shape) for piece, x in zip(pieces, sent)]
    seconds = time.perf_counter() - started
    message = sum(x.numel() * x.element_size() for x in sent)   # what dist.isend / irecv carried
    for hop, x, out, rec in zip(hops, sent, received, records):
        with kept_in(rec):   # each hop named with its own bytes; the shared message once
            note("send", x, x, hop.region, "", hop.direction, cp, issued_bytes=message,
                 sent=0 if cp == 1 else x.numel() * x.element_size(), seconds=seconds)
            note("recv", out, out, hop.region, "", hop.direction, cp, sent=0, seconds=seconds,
                 issued_bytes=message)
    return received


def drive(rings: list[Generator], group: dist.ProcessGroup | None = None,
          records: list[CollectiveRecord | None] | None = None) -> list:
    """Run ring generators in lockstep; return what each returned. Each round, every ring still
    running has yielded one ``Hop``; they all travel in one message. ``records[i]`` (optional)
    also gets ring i's own events (the check's per-layout record)."""
    records = records or [None] * len(rings)
    results: list = [None] * len(rings)
    answers: dict[int, object] = dict.fromkeys(range(len(rings)))   # what each ring gets next
    while answers:
        hops: dict[int, Hop] = {}
        for i, answer in answers.items():
            try:
                value = rings[i].send(answer)
                while not isinstance(value, Hop):   # nothing to pass on: straight back
                    value = rings[i].send(value)
                hops[i] = value
            except StopIteration as done:
                results[i] = done.value
        received = _pass_together(list(hops.values()), group, [records[i] for i in hops]) if hops else []
        answers = dict(zip(hops, received))
    return results

