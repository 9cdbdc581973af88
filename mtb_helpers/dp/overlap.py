"""``OverlappedDDP``: data parallelism whose gradient all-reduces run while the backward still does.

    ddp = OverlappedDDP(model, bucket_cap_mb=25.0)      # inside a rank, any process group
    loss_fn(ddp(x), y).backward()                        # buckets start reducing from grad hooks
    ddp.finish_gradient_synchronization()                # wait for every bucket; grads averaged
    opt.step()

As PyTorch's DDP does (Li et al., "PyTorch Distributed", VLDB 2020): rank 0's parameters and
buffers are broadcast at construction; the trainable parameters are cut into buckets in reverse
registration order (the order a backward produces their gradients), a bucket closing as soon as
it holds at least ``bucket_cap_mb`` MiB, so a large tensor joins the open bucket and closes it, and
``bucket_cap_mb=0`` gives one all-reduce per parameter. Buckets hold one dtype each (a dtype keeps
its own open bucket). A bucket's all-reduce (asynchronous, one flat tensor) starts from
``register_post_accumulate_grad_hook`` once its last gradient is ready, buckets in order (every rank
must issue the same collectives in the same order, whatever order its gradients arrive in).
Tied parameters are one parameter (reduced once); frozen ones are skipped. A parameter that gets no
gradient on this rank counts as zeros, its bucket starting in ``finish_gradient_synchronization``;
with ``find_unused_parameters=True`` each bucket also carries one "used" flag per parameter, and a
parameter no rank used keeps ``grad = None`` (as PyTorch's DDP with the same flag).
``.buckets``: parameter names per bucket, in reduce order. ``.timeline``: the last synchronised
backward's events (``wrapping.StepEvent``): compute until each bucket was ready, and each all-reduce.

``overlap=False`` is notebook 06's DDP: no hooks; after the backward, one bucket per dtype holds
every gradient in registration order and is all-reduced at once (gloo's sum of an element depends
on its place in the buffer, so the order is the lesson's, not the reverse). ``init_sync=False`` (as
PyTorch's DDP names it) skips the broadcast: a caller that puts the same start state on every rank
itself (notebook 06's check, the capstone).
"""
from __future__ import annotations

import contextlib
import time
import weakref
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn

from mtb_helpers.comm.records import note
from mtb_helpers.dp.buckets import assign_buckets, bucket_cap_bytes
from mtb_helpers.dp.wrapping import (WRAPPED_ATTR, StepClock, StepEvent, broadcast_, check_group,
                                     check_module, flat_grads)

__all__ = ["OverlappedDDP", "assign_buckets"]   # assign_buckets: buckets.py's, notebook 14 imports it here


class OverlappedDDP(nn.Module):
    """DDP with gradient buckets all-reduced during the backward; see the module docstring."""

    def __init__(self, module: nn.Module, bucket_cap_mb: float = 25.0, process_group=None, *,
                 find_unused_parameters: bool = False, overlap: bool = True,
                 init_sync: bool = True) -> None:
        check_module(module, "OverlappedDDP")
        cap = bucket_cap_bytes(bucket_cap_mb)
        self.world_size, self.rank = check_group(process_group)
        super().__init__()
        self.module = module
        self.process_group = process_group
        self.bucket_cap_mb = float(bucket_cap_mb)
        self.find_unused_parameters = bool(find_unused_parameters)
        self.overlap = bool(overlap)
        setattr(module, WRAPPED_ATTR, "OverlappedDDP")
        if init_sync:
            broadcast_(list(module.parameters()) + list(module.buffers()), process_group)
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]  # tied: once
        plan = (assign_buckets(named, cap) if overlap else     # else one per dtype, in order
                [[i for i, (_, p) in enumerate(named) if p.dtype == d]
                 for d in dict.fromkeys(p.dtype for _, p in named)])
        self._buckets = [[named[i][1] for i in b] for b in plan]
        self.buckets: list[list[str]] = [[named[i][0] for i in b] for b in plan]
        self._bucket_of = {param: i for i, bucket in enumerate(self._buckets) for param in bucket}
        # weakly: a parameter's hook is out of the garbage collector's sight, so a bound method
        # kept this wrapper, its module and buckets alive as long as the rank (notebook 14: +4 MiB
        # a rank on every measured step)
        on_grad_ready = _weakly(weakref.WeakMethod(self._on_grad_ready))
        self._hooks = [p.register_post_accumulate_grad_hook(on_grad_ready) for _, p in named
                       if overlap]
        self._sync = True
        self.timeline: list[StepEvent] = []
        self._reset()

    def _reset(self) -> None:
        self._ready: set[nn.Parameter] = set()
        self._next = 0                                   # the next bucket to start
        self._pending: list[tuple[int, torch.Tensor, object, int]] = []
        self._clock: StepClock | None = None
        self._started = False

    # --- forward: note where the backward starts -------------------------------------------
    def forward(self, *args, **kwargs):
        if self._pending or self._ready:
            raise RuntimeError("OverlappedDDP: the last backward's buckets were never waited for; "
                               "call finish_gradient_synchronization() after each backward")
        out = self.module(*args, **kwargs)
        if self._sync and torch.is_grad_enabled():
            self._clock = StepClock()
            for t in _tensors(out):
                if t.requires_grad:
                    t.register_hook(self._on_backward_start)
        return out

    def _on_backward_start(self, grad: torch.Tensor) -> None:
        if self._clock is not None and not self._started:
            self._clock.t0, self._started = time.perf_counter(), True   # the timeline's zero

    # --- backward: hooks start the buckets --------------------------------------------------
    def _on_grad_ready(self, param: nn.Parameter) -> None:
        if not self._sync:
            return                                        # no_sync: accumulate locally
        if param in self._ready:
            raise RuntimeError("OverlappedDDP: a parameter's gradient arrived twice before "
                               "finish_gradient_synchronization(); call it after each backward "
                               "(or accumulate inside no_sync())")
        self._ready.add(param)
        if self._clock is None:                           # backward of a tensor not from forward
            self._clock = StepClock()
        while self._next < len(self._buckets) and self._bucket_ready(self._next):
            self._launch(self._next)

    def _bucket_ready(self, i: int) -> bool:
        """Bucket ``i`` may start once every one of its gradients is accumulated."""
        return all(param in self._ready for param in self._buckets[i])

    def _flat_bucket(self, i: int) -> torch.Tensor:
        """Bucket ``i``'s gradients ``[sum of numels (+ flags)]`` (``wrapping.flat_grads``)."""
        return flat_grads(self._buckets[i], self.find_unused_parameters)

    def _launch(self, i: int) -> None:
        clock = self._clock
        prev = max((e.end for e in clock.events), default=0.0)
        clock.add("compute", f"backward until bucket {i} is ready", prev, clock.now())
        flat = self._flat_bucket(i)                   # [sum of numels (+ flags)], one dtype
        work = dist.all_reduce(flat, group=self.process_group, async_op=True)
        key = clock.comm(f"all-reduce bucket {i}", work, flat.numel() * flat.element_size())
        note("all_reduce", flat, flat, "dp-bucket", f"bucket {i}", "backward", self.world_size)
        self._pending.append((i, flat, work, key))
        self._next = i + 1

    # --- after backward -----------------------------------------------------------------------
    def finish_gradient_synchronization(self) -> None:
        """Start the buckets still waiting (gradients this rank never got count as zeros), wait for
        every all-reduce, and write each bucket's average back into its parameters' ``.grad``."""
        if not self._sync:
            return
        if not self.overlap:
            return self._reduce_after_backward()
        if self._clock is None:
            self._clock = StepClock()
        while self._next < len(self._buckets):
            self._launch(self._next)
        for i, flat, work, key in self._pending:
            self._wait(work)
            self._clock.waited(key)
            self._write_back(i, flat)
        self.timeline = self._clock.close()
        self._reset()

    def _reduce_after_backward(self) -> None:
        """``overlap=False``: each bucket ``[sum of numels (+ flags)]`` all-reduced now, one after
        the other, then averaged into its parameters' ``.grad``."""
        for i in range(len(self._buckets)):
            flat = self._flat_bucket(i)
            dist.all_reduce(flat, group=self.process_group)      # in place: the sum over ranks
            note("all_reduce", flat, flat, "ddp_grad_bucket", "", "backward", self.world_size)
            self._write_back(i, flat)
        self._reset()

    def _wait(self, work) -> None:
        work.wait()

    def average(self, summed: torch.Tensor) -> torch.Tensor:
        return summed / self.world_size           # each rank's loss is the mean over its own rows

    def _write_back(self, k: int, flat: torch.Tensor) -> None:
        bucket = self._buckets[k]
        n = sum(p.numel() for p in bucket)
        grads = self.average(flat[:n]).split([p.numel() for p in bucket])
        used = flat[n:] if self.find_unused_parameters else None
        for i, (p, g) in enumerate(zip(bucket, grads)):
            if used is not None and used[i] == 0:
                continue                                  # no rank used it: grad stays None
            p.grad = g.view_as(p)                        # a view of the bucket, as DDP's

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Inside: backwards only accumulate ``.grad`` locally (no communication); the first
        synchronised backward after it reduces the accumulated sum."""
        before, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = before

    def extra_repr(self) -> str:
        return f"bucket_cap_mb={self.bucket_cap_mb}, buckets={len(self.buckets)}, world_size={self.world_size}"


def _weakly(method: weakref.WeakMethod):
    """A hook calling ``method`` while its object lives (and doing nothing after)."""
    def hook(p: nn.Parameter) -> None:
        bound = method()
        if bound is not None:
            bound(p)
    return hook


def _tensors(out) -> Iterator[torch.Tensor]:
    """The tensors inside a forward's output (a tensor, or tuples / lists / dicts of them)."""
    if torch.is_tensor(out):
        yield out
    elif isinstance(out, (list, tuple)):
        for o in out:
            yield from _tensors(o)
    elif isinstance(out, dict):
        for o in out.values():
            yield from _tensors(o)
