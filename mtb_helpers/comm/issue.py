"""``issue()``: perform one collective on this rank and note it in the active records.

Every region of the course (tensor-, sequence-, expert-, data- and context-parallel) goes through
``issue``; a point-to-point message, and the one all-reduce with another operator than a sum (the
vocabulary's max, ``attention/vocab.py``), perform their op themselves and note it with ``records.note``.
So ``with record() as rec:`` sees all of them the same way: what, in which region, which direction, how many
bytes. With one rank every op returns ``x`` unchanged and is still recorded (``sent_bytes == 0``),
so a program's record has the same shape at every world size.
"""
from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from mtb_helpers.comm.records import OPS, note
from mtb_helpers.runtime.link import unmodelled

__all__ = ["issue", "agree", "group_size", "group_rank"]

# torch 2.13 renamed reduce_scatter_tensor (the old name warns); Colab's older torch only has it.
# Looked up by name on every call: an emulated link (runtime/link.py) patches torch.distributed.
_REDUCE_SCATTER = ("reduce_scatter_single" if hasattr(dist, "reduce_scatter_single")
                   else "reduce_scatter_tensor")
# torch.distributed's own functions, as imported: while they are still the ones in place (no
# emulated link, no test, has wrapped them) an op of a real group goes to the group itself, the
# very call they end in (the same c10d op, so a profiler or CommDebugMode sees it too). Their
# Python checks and logging cost ~15 us of a rank's CPU per collective on a shared CPU, ~3 % of a
# capstone step; they guard cases the course never hands them here (complex, coalescing, modes).
_PLAIN = {"all_reduce": dist.all_reduce, "all_gather": dist.all_gather,
          "reduce_scatter": getattr(dist, _REDUCE_SCATTER) if _REDUCE_SCATTER == "reduce_scatter_single"
          else None}


def _direct(op: str, x: torch.Tensor, group) -> bool:
    """Whether ``op`` on ``x`` may skip ``torch.distributed``'s wrapper and call ``group``."""
    name = _REDUCE_SCATTER if op == "reduce_scatter" else op
    return (isinstance(group, dist.ProcessGroup) and getattr(dist, name) is _PLAIN[op]
            and not x.is_complex() and not c10d._world.pg_coalesce_state
            and not torch._C._has_torch_function((x,)))


def group_size(group: dist.ProcessGroup | None = None) -> int:
    if isinstance(group, dist.ProcessGroup):   # every op asks: the group itself answers, ~5x faster
        return group.size()                    # (a group exists only once dist is initialised)
    if not dist.is_initialized():
        return 1
    return dist.get_world_size(group)          # the default group (None), or not a member (-1)


def group_rank(group: dist.ProcessGroup | None = None) -> int:
    return dist.get_rank(group) if dist.is_initialized() else 0


def agree(mine: torch.Tensor, group: dist.ProcessGroup | None = None) -> list[torch.Tensor]:
    """Every rank's ``mine`` (same shape and dtype on every rank), in group-rank order: an
    all-gather for a check the ranks make together (do we all hold shards of one shape?), not
    part of the step's traffic, so neither recorded nor given an emulated link's time."""
    everyone = [torch.empty_like(mine) for _ in range(group_size(group))]
    with unmodelled():
        dist.all_gather(everyone, mine, group=group)
    return everyone


def issue(op: str, x: torch.Tensor, *, region: str, direction: str, operator: str = "",
          dim: int = -1, group: dist.ProcessGroup | None = None,
          splits: tuple[list[int], list[int]] | None = None) -> torch.Tensor:
    """Perform ``op`` on this rank's ``x`` along ``dim`` and record it (every region uses this).

    ``all_reduce``: ``x`` -> sum over ranks, same shape. ``all_gather``: ``[.., n/t]`` ->
    ``[.., n]``, shards concatenated along ``dim`` in rank order. ``reduce_scatter``:
    ``[.., n]`` -> this rank's ``[.., n/t]`` of the sum. ``split``: ``[.., n]`` -> this rank's
    ``[.., n/t]``, no communication. ``all_to_all`` (rows, ``dim`` must be 0): ``x`` ``[m, ..]``
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
        if _direct(op, out, group):
            group.allreduce([out], c10d.AllreduceOptions()).wait()
        else:
            dist.all_reduce(out, group=group)
    elif op == "all_gather":
        x = x.contiguous()
        out = _all_gather(x, dim, group, t)
    elif op == "reduce_scatter":
        out = _reduce_scatter(x, dim, group, t)
    else:
        out = x.chunk(t, dim=dim)[group_rank(group)].contiguous()
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
    if _direct("all_gather", x, group):
        group.allgather([parts], [x], c10d.AllgatherOptions()).wait()
    else:
        dist.all_gather(parts, x, group=group)
    return out if dim == 0 else torch.cat(parts, dim=dim)


def _reduce_scatter(x: torch.Tensor, dim: int, group: dist.ProcessGroup | None,
                    t: int) -> torch.Tensor:
    """``[.., n, ..]`` (``n`` at ``dim``) -> this rank's ``[.., n/t, ..]`` of the sum over the group.

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
    try:
        if _direct("reduce_scatter", full, group):
            group.reduce_scatter_single(out, full, c10d.ReduceScatterOptions()).wait()
        else:
            getattr(dist, _REDUCE_SCATTER)(out, full, group=group)
    except RuntimeError as exc:
        if "support" not in str(exc):
            raise
        total = full.clone()                                     # full may be x itself
        dist.all_reduce(total, group=group)
        out = total.chunk(t)[group_rank(group)]
    return out if dim == 0 else out.movedim(0, dim).contiguous()


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
