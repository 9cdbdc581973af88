"""One hop around the ring: send a tensor to the next rank, receive the previous rank's.

Point-to-point (``isend`` / ``irecv``, which gloo runs on CPU tensors), both posted before either
is waited on, so no rank blocks its neighbour. Every hop is noted in the collective record
(``mtb_helpers.comm.records``) as two events, like the pipeline's point-to-point ops: ``"send"``
(``sent_bytes`` = the tensor's bytes) and ``"recv"`` (0 sent). With one rank the hop is the
identity and sends nothing (still noted, 0 bytes), so a record has the same shape at every size.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from mtb_helpers.comm.records import note
from mtb_helpers.comm.issue import group_rank, group_size

__all__ = ["ring_pass"]


def _global(group: dist.ProcessGroup | None, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def ring_pass(x: torch.Tensor, *, region: str, direction: str,
              group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``x`` goes to rank ``r+1``; the returned tensor (same shape) came from rank ``r-1``."""
    t, r = group_size(group), group_rank(group)
    x = x.contiguous()
    started = time.perf_counter()   # the hop's measured time, in both records
    if t == 1:
        out = x
    else:
        out = torch.empty_like(x)
        requests = [dist.isend(x, dst=_global(group, (r + 1) % t), group=group),    # [..] -> r+1
                    dist.irecv(out, src=_global(group, (r - 1) % t), group=group)]  # [..] <- r-1
        for request in requests:
            request.wait()
    seconds = time.perf_counter() - started
    note("send", x, x, region, "", direction, t, sent=0 if t == 1 else x.numel() * x.element_size(),
         seconds=seconds)
    note("recv", out, out, region, "", direction, t, sent=0, seconds=seconds)
    return out
