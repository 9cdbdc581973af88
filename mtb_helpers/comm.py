"""Autograd-aware collectives ("regions", Megatron naming) and the record of what each rank sent.

Naming (Megatron-LM ``mappings.py``): ``X_to_<region>`` enters the tensor-parallel region,
``X_from_<region>`` leaves it. Each region is a small ``torch.autograd.Function``: its forward is
one communication pattern and its backward is the transpose of it (Shoeybi et al. 2019 call the
first two ``f`` and ``g``):

    region                                      forward                    backward
    copy_to_tensor_model_parallel_region   (f)  identity                   all-reduce
    reduce_from_tensor_model_parallel_region (g) all-reduce                identity
    gather_from_tensor_model_parallel_region    all-gather along last dim  split along last dim
    scatter_to_tensor_model_parallel_region     split along last dim       all-gather along last dim

Every region takes ``group=None`` (the whole world) or a process group, so a later notebook can run
tensor parallelism inside a subgroup. With one rank in the group every region is the identity and
sends nothing (it is still recorded, with ``sent_bytes == 0``); ranks are not even needed then.

The record: inside ``with record() as rec:`` every operation a region issues on this rank is
appended to ``rec`` as a ``CollectiveEvent`` (op, region, direction, shape, bytes), in the order the
rank issued it, forward and backward alike (call ``.backward()`` inside the block). Local splits are
recorded too, with ``sent_bytes == 0``, so a step trace can show them; ``rec.count("all_reduce")``
counts only what you ask for. New regions (sequence parallelism) call ``issue()``, which performs
the operation and records it, so they are recorded the same way.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass
from typing import Iterator

import torch
import torch.distributed as dist

OPS = ("all_reduce", "all_gather", "reduce_scatter", "split", "all_to_all")


@dataclass(frozen=True)
class CollectiveEvent:
    """One operation a region issued on one rank.

    ``shape``/``bytes`` describe the tensor this rank handed to the operation; ``out_shape`` the
    tensor it got back. ``sent_bytes`` is what this rank sends with the usual ring algorithm for a
    group of ``group_size`` ranks and N = ``bytes``: all-reduce 2(t-1)/t N, all-gather (t-1) N,
    reduce-scatter (t-1)/t N, split 0 (local slicing, no communication), all-to-all the bytes
    of the rows addressed to the other ranks (what leaves this rank; its own rows stay).
    """
    op: str
    region: str
    operator: str        # the paper's name for the region ("f", "g") or "" when it has none
    direction: str       # "forward" or "backward"
    shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    dtype: str
    bytes: int
    sent_bytes: int
    group_size: int

    def describe(self) -> str:
        """E.g. ``'forward all_reduce (g) [6, 8] float32: 192 B in, 192 B sent'``."""
        name = f"{self.op} ({self.operator})" if self.operator else self.op
        return (f"{self.direction} {name} {list(self.shape)} {self.dtype}: "
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
        forward and backward always appear; other directions (an optimizer ``step``) when used."""
        parts = []
        for direction in dict.fromkeys(["forward", "backward", *(e.direction for e in self)]):
            counts: dict[str, list[int]] = {}
            for e in self.communicating():
                if e.direction == direction:
                    n, b = counts.get(e.op, [0, 0])
                    counts[e.op] = [n + 1, b + e.bytes]
            text = ", ".join(f"{n} {op} ({b} B)" for op, (n, b) in counts.items()) or "nothing"
            parts.append(f"{direction}: {text}")
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


# The records being filled on this rank process. A plain list rather than a ContextVar because
# autograd may run backward functions on a worker thread, where a ContextVar set here is unset.
_ACTIVE: list[CollectiveRecord] = []


@contextlib.contextmanager
def record(keep_tensors: bool = False) -> Iterator[CollectiveRecord]:
    """Record every region operation issued on this rank inside the block (nesting allowed)."""
    rec = CollectiveRecord(keep_tensors=keep_tensors)
    _ACTIVE.append(rec)
    try:
        yield rec
    finally:
        _ACTIVE.remove(rec)


def _sent_bytes(op: str, nbytes: int, t: int) -> int:
    if op == "all_reduce":
        return 2 * (t - 1) * nbytes // t
    if op == "all_gather":
        return (t - 1) * nbytes
    if op == "reduce_scatter":
        return (t - 1) * nbytes // t
    return 0


def _note(op: str, x: torch.Tensor, out: torch.Tensor, region: str, operator: str,
          direction: str, t: int, sent: int | None = None) -> None:
    nbytes = x.numel() * x.element_size()
    event = CollectiveEvent(op, region, operator, direction, tuple(x.shape), tuple(out.shape),
                            str(x.dtype).replace("torch.", ""), nbytes,
                            _sent_bytes(op, nbytes, t) if sent is None else sent, t)
    for rec in _ACTIVE:
        rec.events.append(event)
        rec.tensors.append((x.detach().clone(), out.detach().clone()) if rec.keep_tensors else None)


def group_size(group: dist.ProcessGroup | None = None) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else 1


def group_rank(group: dist.ProcessGroup | None = None) -> int:
    return dist.get_rank(group) if dist.is_initialized() else 0


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
    if op == "all_to_all":
        return _all_to_all(x, region, operator, direction, dim, group, splits, t)
    if t == 1:
        # One rank: every op is the identity and moves nothing; it is still recorded (0 bytes
        # sent), so a program's record has the same shape at every world size.
        out = x
    elif op == "all_reduce":
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
    elif op == "all_gather":
        parts = [torch.empty_like(x).contiguous() for _ in range(t)]
        dist.all_gather(parts, x.contiguous(), group=group)
        out = torch.cat(parts, dim=dim)
    elif op == "reduce_scatter":
        # gloo has no reduce-scatter on CPU tensors in every torch version: all-reduce then keep
        # this rank's slice gives the same result; the record counts it as the reduce-scatter it is.
        total = x.contiguous().clone()
        dist.all_reduce(total, group=group)
        out = total.chunk(t, dim=dim)[group_rank(group)].contiguous()
    else:
        out = x.chunk(t, dim=dim)[group_rank(group)].contiguous()
    _note(op, x, out, region, operator, direction, t)
    return out


def _all_to_all(x: torch.Tensor, region: str, operator: str, direction: str, dim: int,
                group: dist.ProcessGroup | None, splits: tuple[list[int], list[int]] | None,
                t: int) -> torch.Tensor:
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
    _note("all_to_all", x, out, region, operator, direction, t,
          sent=(sum(send) - send[me]) * row_bytes)
    return out


class _AllReduceGrad(torch.autograd.Function):
    """forward: identity; backward: all-reduce (sum) of the grad over the group."""

    @staticmethod
    def forward(ctx, p, region, operator, group):
        ctx.region, ctx.operator, ctx.group = region, operator, group
        return p.view_as(p)

    @staticmethod
    def backward(ctx, grad):
        return issue("all_reduce", grad, region=ctx.region, operator=ctx.operator,
                     direction="backward", group=ctx.group), None, None, None


def allreduce_grad(p: torch.Tensor, region: str, operator: str = "", group=None) -> torch.Tensor:
    """Use a replicated parameter through this when each rank saw different data (other tokens,
    other sequence rows): its grad is then summed over the group during backward. ``operator``
    names the parameter in the record (``"ln.weight"``), so its all-reduce can be told apart."""
    return _AllReduceGrad.apply(p, region, operator, group)


class _CopyToTensorModelParallelRegion(torch.autograd.Function):
    """f. forward: identity; backward: all-reduce (sum) of the input grad over the group."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return issue("all_reduce", grad, region="copy_to_tensor_model_parallel_region",
                     operator="f", direction="backward", group=ctx.group), None


class _ReduceFromTensorModelParallelRegion(torch.autograd.Function):
    """g. forward: all-reduce (sum) over the group; backward: identity."""

    @staticmethod
    def forward(ctx, x, group):
        return issue("all_reduce", x, region="reduce_from_tensor_model_parallel_region",
                     operator="g", direction="forward", group=group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromTensorModelParallelRegion(torch.autograd.Function):
    """forward: all-gather along the last dim [.., n/t] -> [.., n]; backward: split the last dim."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return issue("all_gather", x, region="gather_from_tensor_model_parallel_region",
                     direction="forward", group=group)

    @staticmethod
    def backward(ctx, grad):
        return issue("split", grad, region="gather_from_tensor_model_parallel_region",
                     direction="backward", group=ctx.group), None


class _ScatterToTensorModelParallelRegion(torch.autograd.Function):
    """forward: split the last dim [.., n] -> [.., n/t]; backward: all-gather along the last dim."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return issue("split", x, region="scatter_to_tensor_model_parallel_region",
                     direction="forward", group=group)

    @staticmethod
    def backward(ctx, grad):
        return issue("all_gather", grad, region="scatter_to_tensor_model_parallel_region",
                     direction="backward", group=ctx.group), None


def copy_to_tensor_model_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """f: forward identity, backward all-reduce. ``x`` is replicated, e.g. ``[s, b, h]``."""
    return _CopyToTensorModelParallelRegion.apply(x, group)


def reduce_from_tensor_model_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """g: forward all-reduce, backward identity. ``x`` is a partial sum of full shape ``[s, b, h]``."""
    return _ReduceFromTensorModelParallelRegion.apply(x, group)


def gather_from_tensor_model_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """forward all-gather last dim ``[.., n/t] -> [.., n]``, backward split last dim."""
    return _GatherFromTensorModelParallelRegion.apply(x, group)


def scatter_to_tensor_model_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """forward split last dim ``[.., n] -> [.., n/t]``, backward all-gather last dim."""
    return _ScatterToTensorModelParallelRegion.apply(x, group)


__all__ = ["CollectiveEvent", "CollectiveRecord", "record", "issue", "group_size", "group_rank",
           "allreduce_grad",
           "copy_to_tensor_model_parallel_region", "reduce_from_tensor_model_parallel_region",
           "gather_from_tensor_model_parallel_region", "scatter_to_tensor_model_parallel_region"]

# The sequence-parallel regions live in comm_sp (they build on issue() above); they are reachable
# from here too, so that every region has one import path. Lazy, because comm_sp imports this module.
_SEQUENCE_PARALLEL_REGIONS = ("scatter_to_sequence_parallel_region",
                              "gather_from_sequence_parallel_region",
                              "reduce_scatter_to_sequence_parallel_region",
                              "allreduce_sequence_parallel_grad")


def __getattr__(name: str):
    if name in _SEQUENCE_PARALLEL_REGIONS:
        from mtb_helpers import comm_sp
        return getattr(comm_sp, name)
    raise AttributeError(f"module 'mtb_helpers.comm' has no attribute {name!r}")
