"""Ring attention: K/V blocks travel around the ring; each rank's queries never leave it.

Forward, on rank r with cp ranks (Liu et al. 2023, "Ring Attention with Blockwise Transformers"):

    step i = 0 .. cp-1:  hold the K/V block of rank (r - i) mod cp
                         fold every chunk pair the mask allows into the online softmax (mx, l, acc)
                         pass the block on: send to r+1, receive from r-1       (cp-1 hops)
    O = acc / l,  lse = mx + log l

Backward, a second ring pass written by hand (not autograd through the ring): each block travels
again **with its dK, dV accumulator**; every rank adds what its queries contribute
(``dV += P^T dO``, ``dK += dS^T Q / sqrt(d)``, with ``P = exp(S - lse)`` rebuilt from the saved
lse and ``dS = P * (dO V^T - rowsum(dO * O))``) and keeps ``dQ`` for itself. After cp steps rank r
holds the finished dK, dV of rank r+1's block, so one last hop sends them home.

Bytes one rank sends, with n the bytes of its K (or V) shard ``[b, heads, s/cp, d]``:
forward ``2 (cp-1) n``; backward ``4 (cp-1) n`` (K, V, dK, dV together) ``+ 2 n`` (the last hop).

Both passes are generators: ``yield Hop(block, ...)`` passes a block on and evaluates to the block
rank r-1 passed on, and ``drive`` performs the hop. A value yielded that is not a ``Hop`` comes
straight back: nothing passed on (a deliberate bug's missing hop). ``drive`` runs one ring, or
several in lockstep (a check running two layouts at once): in every round the hops of all the
rings travel as **one** message, so two rings cost the synchronising rounds of one (on one CPU a
round of 4 ranks costs milliseconds, whatever the few KiB it carries).

A hop is point-to-point (``isend`` / ``irecv``, which gloo runs on CPU tensors), both posted before
either is waited on, so no rank blocks its neighbour. Every hop is noted in the collective record
(``mtb_helpers.comm.records``) as two events, like the pipeline's point-to-point ops: ``"send"``
(``sent_bytes`` = the hop's tensor's bytes) and ``"recv"`` (0 sent), each ring's own hop with its
own bytes whether or not it shared the message. With one rank the hop is the identity and sends
nothing (still noted, 0 bytes), so a record has the same shape at every size.
"""
from __future__ import annotations

import time
from typing import Generator, NamedTuple

import torch
import torch.distributed as dist

from mtb_helpers.comm.mesh import group_rank, group_size
from mtb_helpers.comm.records import CollectiveRecord, note
from mtb_helpers.cp.base import ContextParallelAttention, kept_in
from mtb_helpers.cp.online import finish, online_update

__all__ = ["RingAttention", "ring_attention", "Hop", "drive", "KV", "KV_GRADS", "GRADS_HOME"]

KV, KV_GRADS, GRADS_HOME = "cp.kv", "cp.kv+grads", "cp.grads-home"


class Hop(NamedTuple):
    """What a ring yields to pass ``tensor`` to rank r+1 (it gets rank r-1's back)."""
    tensor: torch.Tensor
    region: str
    direction: str


def _global(group: dist.ProcessGroup | None, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


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



class _Ring(torch.autograd.Function):
    """forward: the ring of K/V blocks with the online softmax; backward: the ring again,
    dK/dV travelling with K/V, then home. Several layers (a check's layouts) run their rings in
    lockstep: one message per hop carries every layer's block (``drive``)."""

    @staticmethod
    def forward(ctx, layers, *qkv):
        shards = [qkv[3 * i:3 * i + 3] for i in range(len(layers))]       # (q, k, v) per layer
        results = drive([layer.forward_ring(*s) for layer, s in zip(layers, shards)],
                        layers[0].group, [layer.record for layer in layers])
        outs = tuple(out for out, _ in results)
        ctx.save_for_backward(*qkv, *outs, *(lse for _, lse in results))
        ctx.layers = layers
        return outs

    @staticmethod
    def backward(ctx, *douts):
        count = len(ctx.layers)
        saved = ctx.saved_tensors
        qkv, outs, lses = saved[:3 * count], saved[3 * count:4 * count], saved[4 * count:]
        rings = [layer.backward_ring(*qkv[3 * i:3 * i + 3], outs[i], lses[i], douts[i].contiguous())
                 for i, layer in enumerate(ctx.layers)]
        grads = drive(rings, ctx.layers[0].group, [layer.record for layer in ctx.layers])
        return (None, *(g for dq_dk_dv in grads for g in dq_dk_dv))


class RingAttention(ContextParallelAttention):
    """Attention of this rank's query shard over the whole sequence, K/V passed around the ring.

    ``steps`` (after a forward) says, per step, which rank's block this rank held, how many chunk
    pairs it computed and the running max of its queries (batch 0, head 0)."""

    @classmethod
    def attend(cls, layers, shards):
        """Every layer's ring, in lockstep (their hops share one message each)."""
        return list(_Ring.apply(layers, *(x for triple in shards for x in triple)))

    def update(self, mx, l, acc, scores, v):
        """One online-softmax step (``online.online_update``)."""
        return online_update(mx, l, acc, scores, v)

    def forward_ring(self, q, k, v):
        """A generator (``drive`` runs it): it yields a ``Hop`` to pass a block on and
        gets the block of rank r-1 back; it returns ``(O, lse)``."""
        b, heads, rows, d = q.shape
        q_pos = self.positions(self.rank, rows)
        mx = torch.full((b, heads, rows, 1), -torch.inf, dtype=q.dtype)
        l = torch.zeros((b, heads, rows, 1), dtype=q.dtype)
        acc = torch.zeros_like(q)
        kv = torch.stack([k, v])                                  # 2 x [b,heads,rows,d] -> [2,b,heads,rows,d]
        for step in range(self.cp):
            source = (self.rank - step) % self.cp
            k_pos = self.positions(source, rows)
            before = self.pairs["forward"]
            for qs, ks, mask in self.chunk_pairs(q_pos, k_pos):
                s = self.scores(q[:, :, qs], kv[0][:, :, ks], mask, "forward")  # [b,heads,nq,nk]
                mx[:, :, qs], l[:, :, qs], acc[:, :, qs] = self.update(
                    mx[:, :, qs], l[:, :, qs], acc[:, :, qs], s, kv[1][:, :, ks])
            self.steps.append({"step": step, "source": source,
                               "pairs": self.pairs["forward"] - before,
                               "running_max": mx[0, 0, :, 0].tolist()})
            if step < self.cp - 1:
                incoming = yield Hop(kv, region=KV, direction="forward")  # [2,b,heads,rows,d] -> r+1; r-1 -> here
                self.hold(kv, incoming)
                kv = incoming
            else:
                self.hold(kv)
        return finish(mx, l, acc)

    def backward_ring(self, q, k, v, out, lse, dout):
        """A generator, as ``forward_ring``; it returns ``(dQ, dK, dV)``."""
        rows = q.shape[2]
        q_pos = self.positions(self.rank, rows)
        delta = (dout * out).sum(-1, keepdim=True)                # [b,heads,rows,d] -> [b,heads,rows,1]
        dq = torch.zeros_like(q)
        kv = torch.stack([k, v])                                  # [2,b,heads,rows,d]
        dkv = torch.zeros_like(kv)                                # dK, dV of the block held
        for step in range(self.cp):
            k_pos = self.positions((self.rank - step) % self.cp, rows)
            for qs, ks, mask in self.chunk_pairs(q_pos, k_pos):
                kb, vb, do = kv[0][:, :, ks], kv[1][:, :, ks], dout[:, :, qs]
                p = torch.exp(self.scores(q[:, :, qs], kb, mask, "backward")
                              - lse[:, :, qs])                    # [b,heads,nq,nk]
                dkv[1][:, :, ks] += p.transpose(-2, -1) @ do      # [b,heads,nk,nq] @ [b,heads,nq,d] -> [b,heads,nk,d]
                dp = do @ vb.transpose(-2, -1)                    # [b,heads,nq,d] @ [b,heads,d,nk] -> [b,heads,nq,nk]
                ds = p * (dp - delta[:, :, qs])                   # [b,heads,nq,nk]
                dq[:, :, qs] += ds @ kb * self.scale              # [b,heads,nq,nk] @ [b,heads,nk,d] -> [b,heads,nq,d]
                dkv[0][:, :, ks] += ds.transpose(-2, -1) @ q[:, :, qs] * self.scale  # -> [b,heads,nk,d]
            if step < self.cp - 1:
                both = yield Hop(torch.cat([kv, dkv]), region=KV_GRADS,
                                 direction="backward")            # [4,b,heads,rows,d] -> r+1; r-1 -> here
                kv, dkv = both[:2], both[2:]
        dkv = yield self.send_grads_home(dkv)
        return dq, dkv[0], dkv[1]

    def send_grads_home(self, dkv: torch.Tensor) -> Hop:
        """Rank r holds the finished dK, dV of rank r+1's block: one more hop delivers them."""
        return Hop(dkv, region=GRADS_HOME, direction="backward")   # [2,b,heads,rows,d] -> r+1; r-1 -> here


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   layout: str = "contiguous", group=None) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d), causal mask by global position) v`` for this rank's queries.

    ``q, k, v``: this rank's ``[b, heads, s/cp, d]`` shards (``shard_sequence(.., dim=2)``);
    returns this rank's ``[b, heads, s/cp, d]`` output shard, differentiable."""
    return RingAttention(causal, layout, group)(q, k, v)
