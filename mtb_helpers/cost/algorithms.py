"""Three all-reduce algorithms written with send and receive, to time against their formulas.

    y = all_reduce_by(x, "ring")     # inside a rank: the sum over ranks of x [n], n divisible by p

* ``ring``: reduce-scatter then all-gather around the ring; p-1 steps each, every step sends one
  chunk [n/p] to rank r+1 while receiving one from r-1: 2(p-1) messages of n/p.
* ``halving-doubling``: Rabenseifner's recursive halving (reduce-scatter) then recursive doubling
  (all-gather) with partner r XOR d: 2 lg p messages of n/2, n/4, ... and back: the ring's bytes
  in fewer messages. A p that is not a power of two folds its extra ranks into partners first and
  out last (Thakur et al. 2005). Not NCCL's "tree" (a double binary tree, another algorithm).
* ``naive``: every rank sends its whole vector to rank 0, which adds them and sends the sum back
  to each: 2(p-1) messages of n through rank 0's one link.

Under an emulated link each message takes α + bytes/β and a rank's messages leave (and arrive)
one after another, so the measured time is the algorithm's schedule on that link, to compare with
``predict("all-reduce", ..., algorithm=...)``: formulas and code are written separately. The sum
is the same as ``dist.all_reduce``'s up to the order of additions (exact on integer data).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["all_reduce_by", "ALL_REDUCE_ALGORITHMS"]

ALL_REDUCE_ALGORITHMS = ("ring", "halving-doubling", "naive")


def _exchange(send: torch.Tensor, peer_out: int, recv: torch.Tensor, peer_in: int) -> None:
    """Send ``send`` to ``peer_out`` while receiving ``recv`` from ``peer_in``."""
    handles = [dist.isend(send.contiguous(), peer_out), dist.irecv(recv, peer_in)]
    for h in handles:
        h.wait()


def _ring(x: torch.Tensor, r: int, p: int) -> torch.Tensor:
    chunks = list(x.clone().chunk(p))                    # [n] -> p chunks [n/p]
    right, left = (r + 1) % p, (r - 1) % p
    buf = torch.empty_like(chunks[0])
    for s in range(p - 1):                               # reduce-scatter: chunk r+1 ends summed here
        _exchange(chunks[(r - s) % p], right, buf, left)
        chunks[(r - s - 1) % p] += buf
    for s in range(p - 1):                               # all-gather the summed chunks
        _exchange(chunks[(r + 1 - s) % p], right, buf, left)
        chunks[(r - s) % p] = buf.clone()
    return torch.cat(chunks)


def _halving_doubling(x: torch.Tensor, r: int, p: int) -> torch.Tensor:
    low = 1 << (p.bit_length() - 1)                      # p': the largest power of two <= p
    y = x.clone()
    if r >= low:                                         # an extra rank: fold in, wait, fold out
        dist.send(y, r - low)
        dist.recv(y, r - low)
        return y
    if r + low < p:
        extra = torch.empty_like(y)
        dist.recv(extra, r + low)
        y += extra
    lo, hi, steps = 0, y.numel(), []
    d = low // 2
    while d >= 1:                                        # recursive halving: keep half, send half
        partner, mid = r ^ d, (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if r & d == 0 else ((mid, hi), (lo, mid))
        buf = torch.empty(keep[1] - keep[0], dtype=y.dtype)
        _exchange(y[give[0]:give[1]], partner, buf, partner)
        y[keep[0]:keep[1]] += buf
        steps.append((partner, keep, give))
        lo, hi = keep
        d //= 2
    for partner, keep, give in reversed(steps):          # recursive doubling: swap the halves back
        buf = torch.empty(give[1] - give[0], dtype=y.dtype)
        _exchange(y[keep[0]:keep[1]], partner, buf, partner)
        y[give[0]:give[1]] = buf
    if r + low < p:
        dist.send(y, r + low)
    return y


def _naive(x: torch.Tensor, r: int, p: int) -> torch.Tensor:
    y = x.clone()
    if r == 0:
        buf = torch.empty_like(y)
        for q in range(1, p):                            # p-1 whole vectors into one link
            dist.recv(buf, q)
            y += buf
        for q in range(1, p):                            # and the sum back out, one by one
            dist.send(y, q)
    else:
        dist.send(y, 0)
        dist.recv(y, 0)
    return y


def all_reduce_by(x: torch.Tensor, algorithm: str = "ring") -> torch.Tensor:
    """Inside a rank: the sum over the world of ``x`` (1-D [n], n divisible by the world size),
    computed by ``algorithm`` with point-to-point messages only. Returns a new tensor."""
    if algorithm not in ALL_REDUCE_ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; expected one of "
                         f"{', '.join(ALL_REDUCE_ALGORITHMS)}")
    r, p = dist.get_rank(), dist.get_world_size()
    if x.dim() != 1 or x.numel() % p:
        raise ValueError(f"all_reduce_by needs a 1-D tensor whose length divides by {p}, "
                         f"got shape {list(x.shape)}")
    if p == 1:
        return x.clone()
    return {"ring": _ring, "halving-doubling": _halving_doubling, "naive": _naive}[algorithm](x, r, p)
