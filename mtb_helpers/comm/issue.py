"""``issue()``: perform one collective on this rank along any dim and name it in the records.

The regions of tensor and sequence parallelism (``comm/regions.py``) call ``torch.distributed``
themselves. The other topics (expert-, data- and context-parallel) still go through ``issue``:
it calls the same public ``torch.distributed`` function, which the record observes from below,
and names the event (region, operator, direction) with ``records.note``. With one rank every op
returns ``x`` unchanged and is still recorded (``sent_bytes == 0``), so a program's record has
the same shape at every world size.
"""
from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from mtb_helpers.comm.mesh import group_rank, group_size
from mtb_helpers.comm.records import note

__all__ = ["issue"]

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
# torch 2.13 renamed these (the old names warn); Colab's older torch has only the old ones.
# Looked up by name on every call: a test may replace them.
_ALL_GATHER = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
_REDUCE_SCATTER = ("reduce_scatter_single" if hasattr(dist, "reduce_scatter_single")
                   else "reduce_scatter_tensor")


def issue(op: str, x: torch.Tensor, *, region: str, direction: str, operator: str = "",
          dim: int = -1, group: dist.ProcessGroup | None = None,
          splits: tuple[list[int], list[int]] | None = None) -> torch.Tensor:
    """Perform ``op`` on this rank's ``x`` along ``dim`` and name it in the records.

    ``all_reduce``: ``x`` -> sum over ranks, same shape. ``all_gather``: ``[.., n/t]`` ->
    ``[.., n]``, shards concatenated along ``dim`` in rank order. ``reduce_scatter``:
    ``[.., n]`` -> this rank's ``[.., n/t]`` of the sum. ``all_to_all`` (rows, ``dim`` must be 0): ``x`` ``[m, ..]``
    is cut into ``splits[0][q]`` consecutive rows for rank q; the result stacks the
    ``splits[1][q]`` rows received from each rank q in rank order, ``[sum(splits[1]), ..]``.
    Without ``splits`` every rank sends ``m/t`` rows to each rank. ``sent_bytes`` counts the rows
    sent to the other ranks.
    With one rank every op returns ``x`` unchanged (recorded with ``sent_bytes == 0``).
    """
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; expected one of {OPS}")
    t = group_size(group)
    dim = dim % x.dim()
    started = time.perf_counter()   # the record's measured time
    if op == "all_to_all":
        return _all_to_all(x, region, operator, direction, dim, group, splits, t, started)
    if t == 1:
        # One rank: every op is the identity and moves nothing; it is still recorded (0 bytes
        # sent), so a program's record has the same shape at every world size.
        out = x
    elif op == "all_reduce":
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
    elif op == "all_gather":
        out = _all_gather(x.contiguous(), dim, group, t)
    else:
        out, issued = _reduce_scatter(x, dim, group, t)
        note(op, x, out, region, operator, direction, t, seconds=time.perf_counter() - started,
             issued=issued)
        return out
    note(op, x, out, region, operator, direction, t, seconds=time.perf_counter() - started)
    return out


def _all_gather(x: torch.Tensor, dim: int, group, t: int) -> torch.Tensor:
    """``[.., n, ..]`` (``n`` at ``dim``, ``x`` contiguous) -> the ``t`` shards in rank order,
    ``[.., t n, ..]``. Along dim 0 each shard lands straight in its rows of the result."""
    if dim == 0:
        out, n = x.new_empty((t * x.shape[0], *x.shape[1:])), x.shape[0]
        parts = [out[q * n:(q + 1) * n] for q in range(t)]
    else:
        parts = [torch.empty_like(x) for _ in range(t)]
    dist.all_gather(parts, x, group=group)
    return out if dim == 0 else torch.cat(parts, dim=dim)


def _reduce_scatter(x: torch.Tensor, dim: int, group: dist.ProcessGroup | None,
                    t: int) -> tuple[torch.Tensor, str]:
    """``[.., n, ..]`` (``n`` at ``dim``) -> this rank's ``[.., n/t, ..]`` of the sum over the group,
    and the op that produced it (``"reduce_scatter"``, or ``"all_reduce"`` on an old gloo).

    Issues the real reduce-scatter (``dist.reduce_scatter_tensor``, ``reduce_scatter_single`` in
    torch 2.13; what DTensor and FSDP2 call), so a profiler or
    ``CommDebugMode`` sees the collective the record names. gloo implements it with an all-reduce
    inside (notebook 00 measures the bytes); older gloo builds have none at all, and there the same
    result comes from an all-reduce and this rank's chunk.
    """
    n = x.shape[dim]
    if n % t:
        raise ValueError(f"reduce_scatter: dim {dim} has size {n}, not divisible by the "
                         f"{t} ranks of the group")
    full = (x if dim == 0 else x.movedim(dim, 0)).contiguous()   # [n, ..]: chunks are contiguous
    out = full.new_empty((n // t, *full.shape[1:]))              # [n, ..] -> reduce-scatter -> [n/t, ..]
    issued = "reduce_scatter"
    try:
        getattr(dist, _REDUCE_SCATTER)(out, full, group=group)
    except RuntimeError as exc:
        if "support" not in str(exc):
            raise
        total, issued = full.clone(), "all_reduce"               # full may be x itself
        dist.all_reduce(total, group=group)
        out = total.chunk(t)[group_rank(group)]
    return (out if dim == 0 else out.movedim(0, dim).contiguous()), issued


def _all_to_all(x: torch.Tensor, region: str, operator: str, direction: str, dim: int,
                group: dist.ProcessGroup | None, splits: tuple[list[int], list[int]] | None,
                t: int, started: float) -> torch.Tensor:
    if dim != 0:
        raise ValueError(f"all_to_all exchanges rows (dim 0), got dim={dim}")
    if splits is None:
        if x.shape[0] % t:
            raise ValueError(f"all_to_all without splits needs {x.shape[0]} rows divisible by {t}")
        splits = ([x.shape[0] // t] * t, [x.shape[0] // t] * t)
    send, recv = [int(n) for n in splits[0]], [int(n) for n in splits[1]]
    if len(send) != t or len(recv) != t or sum(send) != x.shape[0] or min(send + recv) < 0:
        raise ValueError(f"all_to_all splits {send} / {recv} do not fit {t} ranks and "
                         f"{x.shape[0]} rows")
    row_bytes = (x.numel() // x.shape[0] if x.shape[0] else math.prod(x.shape[1:])) * x.element_size()
    me = group_rank(group)
    if t == 1:
        if recv != send:
            raise ValueError(f"all_to_all on one rank receives what it sends, got {send} / {recv}")
        out = x
    else:
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv,
                               input_split_sizes=send, group=group)
    note("all_to_all", x, out, region, operator, direction, t,
         sent=(sum(send) - send[me]) * row_bytes, seconds=time.perf_counter() - started)
    return out
