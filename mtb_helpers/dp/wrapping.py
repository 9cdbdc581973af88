"""What the hiding-communication wrappers share: their checks at construction, the process group,
the three collectives in both torch spellings, and the per-rank timeline of a step.

``OverlappedDDP`` (overlap.py), ``ShardedOptimizer`` (sharded_optimizer.py) and ``FSDP``
(fsdp_wrapper.py) are built inside a rank, under whatever process group the script made: the
course's ``run()``, torchrun, or ``torch.multiprocessing.spawn`` + ``init_process_group("gloo")``.
Each event of a timeline is plain data, ``StepEvent(kind, name, start, end, nbytes)`` with ``kind``
``"compute"`` or ``"comm"`` and times in seconds from the start of the step on this rank's clock
(``time.perf_counter``), so a figure can draw a compute lane and a comm lane per rank. (Not
``runtime.timeline.LinkEvent``, the emulated link's view of a whole ``run`` call: a ``StepClock``
knows only its own rank, from its step's start, and has no model.)
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


__all__ = ["StepEvent", "StepClock", "check_module", "check_group", "broadcast_",
           "flat_grads", "all_gather_async", "reduce_scatter_async", "WRAPPED_ATTR"]

# Set on a module when a wrapper takes it: wrapping it again is refused (two wrappers would both
# reduce its gradients, or one would shard what the other expects whole).
WRAPPED_ATTR = "_mtb_wrapped_by"


@dataclass(frozen=True)
class StepEvent:
    """One interval on one rank: ``kind`` "compute" or "comm", seconds from the step's start."""
    kind: str
    name: str
    start: float
    end: float
    nbytes: int = 0

    @property
    def duration(self) -> float:
        return self.end - self.start


class StepClock:
    """A wrapper's clock for one step on this rank: collects its ``StepEvent`` s; ``comm`` ends
    arrive from gloo's thread (a future callback), which is why ends are stored by index and not
    appended in order."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.events: list[StepEvent] = []
        self._open: dict[int, tuple[str, str, float, int]] = {}
        self._ends: dict[int, float] = {}

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def add(self, kind: str, name: str, start: float, end: float, nbytes: int = 0) -> None:
        self.events.append(StepEvent(kind, name, start, end, nbytes))

    def comm(self, name: str, work, nbytes: int) -> int:
        """Note an asynchronous collective just issued; its end is taken when gloo completes it
        (a future callback), or, for ops whose work has no future (gloo's reduce-scatter), when
        the caller waited for it (``waited``). Returns the key ``waited`` takes."""
        key = len(self._open)
        self._open[key] = ("comm", name, self.now(), nbytes)
        try:
            work.get_future().then(lambda _f, key=key: self._ends.setdefault(key, self.now()))
        except (RuntimeError, AttributeError):     # no future (gloo's reduce-scatter, a link's handle)
            pass
        return key

    def waited(self, key: int) -> None:
        """The caller has just waited for collective ``key``: it ended by now at the latest."""
        self._ends.setdefault(key, self.now())

    def close(self) -> list[StepEvent]:
        """Every event, comm ones with their completion time (call after waiting for them)."""
        done = [StepEvent(kind, name, start, self._ends.get(key, self.now()), nbytes)
                for key, (kind, name, start, nbytes) in self._open.items()]
        return sorted(self.events + done, key=lambda e: (e.start, e.kind))


def check_group(process_group) -> tuple[int, int]:
    """``(world size, rank)`` in ``process_group`` (None = the default group); refuses a missing one."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("no process group: build the wrapper inside a rank (mtb_helpers.run, "
                           "torchrun, or after torch.distributed.init_process_group('gloo'))")
    if process_group is not None and not isinstance(process_group, dist.ProcessGroup):
        raise ValueError(f"process_group must be a torch.distributed.ProcessGroup or None, got "
                         f"{type(process_group).__name__}")
    return dist.get_world_size(process_group), dist.get_rank(process_group)


def check_module(module, wrapper: str) -> None:
    """Refuse what no wrapper can take: not a module, a module already wrapped (by this wrapper,
    another of the course's, or PyTorch's DDP: the ``DistributedDataParallel`` itself, the module
    a live one wraps, or a module holding either), parameters on several devices."""
    if not isinstance(module, nn.Module):
        raise ValueError(f"{wrapper}: module must be a torch.nn.Module, got {type(module).__name__}")
    subs = list(module.modules())
    owners = [(sub, getattr(sub, WRAPPED_ATTR, None)) for sub in subs]
    wrapped = next(((sub, owner) for sub, owner in owners if owner is not None), None)
    if wrapped is None and (sub := _in_pytorch_ddp(subs)) is not None:
        wrapped = sub, "DistributedDataParallel"
    if wrapped is not None:
        raise ValueError(f"{wrapper}: module {type(wrapped[0]).__name__} is already wrapped by "
                         f"{wrapped[1]}; wrap a module once (two wrappers would both synchronise "
                         "its gradients)")
    devices = {p.device for p in module.parameters()} | {b.device for b in module.buffers()}
    if len(devices) > 1:
        raise ValueError(f"{wrapper}: module's parameters are on different devices "
                         f"({', '.join(sorted(map(str, devices)))}); move it to one device first")


def _in_pytorch_ddp(subs: list[nn.Module]) -> nn.Module | None:
    """The first of ``subs`` that is a ``DistributedDataParallel`` or the ``.module`` of a live
    one, or None. PyTorch's DDP marks nothing on the module it wraps (its hooks live in C++): look
    among what refers to the modules (a garbage-collector pass, ~30 ms; a second one only when a
    dict outside the module tree holds one of them, e.g. a DDP's ``_modules``)."""
    import gc

    from torch.nn.parallel import DistributedDataParallel
    direct = next((m for m in subs if isinstance(m, DistributedDataParallel)), None)
    if direct is not None:
        return direct
    ids, inside = {id(m) for m in subs}, {id(m._modules) for m in subs}
    holders = [r for r in gc.get_referrers(*subs) if type(r) is dict and id(r) not in inside
               and any(id(v) in ids for v in r.values())]
    for r in gc.get_referrers(*holders) if holders else ():
        # a DDP (Python >= 3.12 lists the object), or its __dict__ (3.11 lists that)
        if isinstance(r, DistributedDataParallel) or (type(r) is dict and "reducer" in r
                                                      and "static_graph" in r):
            held = (r._modules if isinstance(r, nn.Module) else r.get("_modules", {})).get("module")
            if held is not None and id(held) in ids:
                return held
    return None


def broadcast_(tensors: list[torch.Tensor], process_group) -> None:
    """Give every rank the group's rank 0 values, one broadcast per dtype (flat, in place)."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    # broadcast names its source by global rank: the group's rank 0
    src = 0 if process_group is None else dist.get_global_rank(process_group, 0)
    for group in by_dtype.values():
        flat = torch.cat([t.detach().reshape(-1) for t in group])
        dist.broadcast(flat, src=src, group=process_group)
        with torch.no_grad():
            for t, v in zip(group, flat.split([t.numel() for t in group])):
                t.copy_(v.view_as(t))


def flat_grads(params: list[torch.Tensor], flags: bool) -> torch.Tensor:
    """``params``' gradients in one flat tensor ``[sum of numels (+ flags)]``: a gradient this rank
    never got counts as zeros; with ``flags`` one "used" flag per parameter rides along (summed over
    ranks with the gradients, a 0 says no rank used it)."""
    parts = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
    if flags:
        parts.append(torch.tensor([float(p.grad is not None) for p in params], dtype=params[0].dtype))
    return torch.cat(parts)


def all_gather_async(out: torch.Tensor, shard: torch.Tensor, process_group):
    """``shard [n/p]`` of every rank -> ``out [n]`` in rank order; returns the work handle."""
    # looked up at each call: an emulated link replaces these functions while a call runs; torch
    # 2.13 renamed them (the old names warn), Colab's older torch has only the old ones
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(out, shard, group=process_group, async_op=True)


def reduce_scatter_async(out: torch.Tensor, full: torch.Tensor, process_group):
    """``full [n]`` summed over ranks, this rank's ``out [n/p]`` of it; returns the work handle."""
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return scatter(out, full, group=process_group, async_op=True)
