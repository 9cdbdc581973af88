"""``FSDP``: fully sharded data parallelism (ZeRO-3) with prefetch and mixed precision, as a wrapper.

    fsdp = FSDP(model, compute_dtype=torch.bfloat16, reduce_dtype=torch.float32)   # inside a rank
    opt = torch.optim.AdamW(fsdp.parameters(), lr=1e-3)     # steps the fp32 shards
    loss_fn(fsdp(x), y).backward(); fsdp.finish_gradient_synchronization(); opt.step()
    fsdp.gather_full_params()                               # {name: full fp32 tensor}

Each module that ``shard`` selects (a predicate; default: modules owning parameters directly, such
as ``nn.Linear``) becomes a unit managing the parameters of its subtree that no nested unit
manages. A unit keeps only this rank's shard of them (``fsdp_units.FlatGroup``), all-gathers them
before its forward and again before its backward, frees them after each, and reduce-scatters their
gradient (in ``reduce_dtype``) into the shard's ``.grad``. ``compute_dtype`` casts the shards
before the all-gather (half the bytes), so forward and backward run in it, and casts the unit's
floating inputs, while the shards (master weights, the optimizer) stay in the parameters' dtype:
FSDP2's ``MixedPrecisionPolicy(param_dtype, reduce_dtype)``; ``reduce_dtype=None`` reduces in the
compute dtype, as FSDP2 does. With ``prefetch`` a unit's all-gather is issued while the unit before
it computes: in the forward the next unit in the previous forward's order, in the backward the
unit that ran before it in this forward. Parameters outside every unit, and a parameter tied between
two units, stay whole on every rank; their gradients are all-reduced (averaged) in
``finish_gradient_synchronization``, one flag per parameter riding along, so that one no rank used
keeps ``grad = None``. Every rank must run the same units (as PyTorch's FSDP requires).
"""
from __future__ import annotations

import weakref
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from mtb_helpers.comm.records import note
from mtb_helpers.dp.fsdp_units import FlatGroup, find_units
from mtb_helpers.dp.wrapping import (WRAPPED_ATTR, StepClock, StepEvent, broadcast_, check_group, check_module,
                                     flat_grads)

__all__ = ["FSDP", "owns_parameters", "check_dtype"]


def owns_parameters(module: nn.Module) -> bool:
    """The default ``shard`` predicate: the module holds parameters itself (``nn.Linear``, ...)."""
    return any(True for _ in module.parameters(recurse=False))


def check_dtype(name: str, dtype) -> None:   # compute_dtype / reduce_dtype (FSDP, check_overlap)
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"{name} must be a floating-point torch.dtype (torch.bfloat16, "
                         f"torch.float16, torch.float32, ...) or None, got {dtype!r}")


class _BeforeBackward(torch.autograd.Function):
    """Identity on a unit's outputs; its backward runs first in the unit's backward: re-gather."""

    @staticmethod
    def forward(ctx, fsdp, unit, *xs):
        ctx.fsdp, ctx.unit = fsdp, unit
        return tuple(x.view_as(x) for x in xs)

    @staticmethod
    def backward(ctx, *grads):
        ctx.fsdp._before_backward(ctx.unit)
        return (None, None, *grads)


class FSDP(nn.Module):
    """ZeRO-3 with prefetch and mixed precision; see the module docstring."""

    def __init__(self, module: nn.Module, shard: Callable[[nn.Module], bool] | None = None,
                 compute_dtype: torch.dtype | None = None, reduce_dtype: torch.dtype | None = None,
                 prefetch: bool = True, process_group=None) -> None:
        check_module(module, "FSDP")
        if shard is not None and not callable(shard):
            raise ValueError(f"shard must be a predicate module -> bool or None, got {shard!r}")
        check_dtype("compute_dtype", compute_dtype)
        check_dtype("reduce_dtype", reduce_dtype)
        self.world_size, self.rank = check_group(process_group)
        super().__init__()
        self.module, self.process_group, self.prefetch = module, process_group, bool(prefetch)
        self.compute_dtype, self.reduce_dtype = compute_dtype, reduce_dtype or compute_dtype
        units, owner = find_units(module, shard or owns_parameters)
        broadcast_(list(module.parameters()) + list(module.buffers()), process_group)
        names = list(module.named_parameters())                    # the original names (tied: once)
        places: dict[nn.Parameter, list[tuple[nn.Module, str]]] = {}
        unit_of: dict[nn.Parameter, set[int]] = {}
        for m in module.modules():
            for attr, p in m._parameters.items():
                if p is not None:
                    places.setdefault(p, []).append((m, attr))
                    unit_of.setdefault(p, set()).add(owner.get(m, -1))
        # a parameter tied between two units, or between a unit and the rest, stays whole
        managed = {p for p, us in unit_of.items() if len(us) == 1 and -1 not in us}
        self.units: list[list[FlatGroup]] = []
        self.unit_names: list[str] = []
        where: dict[nn.Parameter, tuple[int, int, int]] = {}
        for u, (name, m) in enumerate(units):
            mine = [p for p, us in unit_of.items() if p in managed and u in us]
            kinds = list(dict.fromkeys((p.dtype, p.requires_grad) for p in mine))
            if not kinds:
                continue
            v, groups = len(self.units), []
            for k, kind in enumerate(kinds):
                ps = [p for p in mine if (p.dtype, p.requires_grad) == kind]
                groups.append(FlatGroup(name or "<root>", ps, [places[p] for p in ps],
                                        self.world_size, self.rank, compute_dtype, process_group))
                where.update({p: (v, k, i) for i, p in enumerate(ps)})
            self.units.append(groups)
            self.unit_names.append(name or "<root>")
            m.register_forward_pre_hook(self._make_pre_forward(v), with_kwargs=True)
            m.register_forward_hook(self._make_post_forward(v))
        if not self.units:       # no selected module owns a parameter that is not tied across units
            raise ValueError("shard selects no module that owns parameters: nothing would be sharded")
        self.flat_shards = nn.ParameterList([g.shard for gs in self.units for g in gs])
        # names -> (unit, group, index) for sharded parameters, the parameter itself if whole; the
        # sharded originals are dropped here, so their memory goes
        self._layout = [(n, where.get(p, p)) for n, p in names]
        self._whole = [p for p in places if p not in managed and p.requires_grad]
        if compute_dtype is not None:       # whole parameters compute in compute_dtype too
            for m in module.modules():
                attrs = [a for a, p in m._parameters.items() if p is not None and p not in managed]
                if attrs:
                    m.register_forward_pre_hook(self._make_cast_whole(attrs), with_kwargs=True)
                    m.register_forward_hook(self._make_restore_whole(attrs))
        for u, gs in enumerate(self.units):
            for g in gs:
                if g.trainable:
                    g.full.register_post_accumulate_grad_hook(self._make_grad_ready(u, g))
        setattr(module, WRAPPED_ATTR, "FSDP")
        self._last_order = list(range(len(self.units)))
        self._order: list[int] = []
        self._pending: list = []
        self._bwd_start: dict[int, float] = {}
        self._stashed: dict[tuple[int, str], nn.Parameter] = {}
        self.timeline: list[StepEvent] = []
        self._clock = StepClock()

    # --- forward ------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        if self._pending:
            raise RuntimeError("FSDP: call finish_gradient_synchronization() after each backward")
        self._last_order, self._order = (self._order or self._last_order), []
        self._clock, self._bwd_start = StepClock(), {}
        return self.module(*args, **kwargs)

    def _next_in(self, order: list[int], u: int, step: int) -> int | None:
        """The unit after (``step=1``) or before (``-1``) unit ``u`` in ``order``, to prefetch."""
        if u not in order:
            return None
        i = order.index(u) + step
        return order[i] if 0 <= i < len(order) else None

    def _unshard(self, u: int, direction: str) -> None:
        """Unit ``u``'s parameters gathered: waits for its prefetch, or gathers now (on demand)."""
        for g in self.units[u]:
            work = g.start_gather(direction)
            if work is not None:
                self._clock.comm(f"all-gather {self.unit_names[u]} (on demand)", work, g.gather_bytes)
            g.wait_gather(set_views=direction == "forward")

    def _start_prefetch(self, u: int | None, direction: str) -> None:
        if self.prefetch and u is not None:
            for g in self.units[u]:
                work = g.start_gather(direction)
                if work is not None:
                    self._clock.comm(f"all-gather {self.unit_names[u]} (prefetch)", work, g.gather_bytes)

    def _make_pre_forward(self, u: int):
        def pre_forward(module, args, kwargs):
            self._order.append(u)
            self._unshard(u, "forward")
            self._start_prefetch(self._next_in(self._last_order, u, 1), "forward")
            self._t_start = self._clock.now()
            return self._cast(args, kwargs) if self.compute_dtype is not None else (args, kwargs)
        return pre_forward

    def _cast(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Floating-point inputs in the compute dtype (FSDP2's ``cast_forward_inputs``)."""
        cast = lambda x: (x.to(self.compute_dtype) if torch.is_tensor(x) and x.is_floating_point()
                          else x)
        return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}

    def _make_cast_whole(self, attrs: list[str]):
        def cast_whole(module, args, kwargs):
            for a in attrs:      # a cast copy for the forward; its gradient flows to the parameter
                p = module._parameters.pop(a)
                setattr(module, a, p.to(self.compute_dtype))
                self._stashed[(id(module), a)] = p
            return self._cast(args, kwargs)
        return cast_whole

    def _make_restore_whole(self, attrs: list[str]):
        def restore_whole(module, args, out):
            for a in attrs:
                delattr(module, a)
                module._parameters[a] = self._stashed.pop((id(module), a))
            return out
        return restore_whole

    def _make_post_forward(self, u: int):
        def post_forward(module, args, out):
            self._clock.add("compute", f"forward {self.unit_names[u]}", self._t_start, self._clock.now())
            if not torch.is_grad_enabled():
                self._reshard(u)
                return out
            if torch.is_tensor(out) and out.requires_grad:
                out = _BeforeBackward.apply(self, u, out)[0]
            elif isinstance(out, tuple) and any(torch.is_tensor(o) and o.requires_grad for o in out):
                idx = [i for i, o in enumerate(out) if torch.is_tensor(o) and o.requires_grad]
                new = _BeforeBackward.apply(self, u, *(out[i] for i in idx))
                out = tuple(new[idx.index(i)] if i in idx else o for i, o in enumerate(out))
            else:
                return out          # outputs we cannot see: keep the parameters until the backward
            self._reshard(u)
            return out
        return post_forward

    def _reshard(self, u: int) -> None:
        for g in self.units[u]:
            g.reshard()

    # --- backward -----------------------------------------------------------------------------
    def _before_backward(self, u: int) -> None:
        self._unshard(u, "backward")
        self._start_prefetch(self._next_in(self._order, u, -1), "backward")
        self._bwd_start.setdefault(u, self._clock.now())

    def _make_grad_ready(self, u: int, g: FlatGroup):
        # weakly: a tensor's hook is out of the garbage collector's sight (see overlap.py)
        wrapper, group = weakref.ref(self), weakref.ref(g)

        def grad_ready(full: torch.Tensor) -> None:
            me, flat = wrapper(), group()
            if me is not None and flat is not None:
                me._grad_ready(u, flat, full)
        return grad_ready

    def _grad_ready(self, u: int, g: FlatGroup, full: torch.Tensor) -> None:
        grad, full.grad = full.grad, None
        start = self._bwd_start.pop(u, self._clock.now())
        self._clock.add("compute", f"backward {self.unit_names[u]}", start, self._clock.now())
        work, out, send = g.reduce_grad(grad, self._reduce_dtype(g))
        key = self._clock.comm(f"reduce-scatter {self.unit_names[u]}", work,
                               send.numel() * send.element_size())
        self._pending.append((g, work, out, key, send))   # send stays alive until done
        g.reshard()         # frozen groups of the unit may still be needed: freed in finish

    def _reduce_dtype(self, g: FlatGroup) -> torch.dtype:
        return self.reduce_dtype or g.shard.dtype

    def finish_gradient_synchronization(self) -> None:
        """Wait for every reduce-scatter and put ``sum / p`` into the shards' ``.grad`` (master
        dtype); all-reduce the whole parameters' gradients; free what a prefetch left gathered."""
        for g, work, out, key, _ in self._pending:
            work.wait()
            self._clock.waited(key)
            grad = self.average(out).to(g.shard.dtype)
            g.shard.grad = grad if g.shard.grad is None else g.shard.grad + grad
        self._pending = []
        if self._whole:
            self._reduce_whole()
        for u in range(len(self.units)):
            self._reshard(u)
        self.timeline = self._clock.close()

    def average(self, summed: torch.Tensor) -> torch.Tensor:
        return summed / self.world_size        # each rank's loss is the mean over its own rows

    def _reduce_whole(self) -> None:
        ps = self._whole
        flat = flat_grads(ps, flags=True)                    # [sum of numels + flags]
        dist.all_reduce(flat, group=self.process_group)
        note("all_reduce", flat, flat, "fsdp-whole", "unsharded parameters", "backward", self.world_size)
        n = flat.numel() - len(ps)
        for p, g, c in zip(ps, flat[:n].split([p.numel() for p in ps]), flat[n:]):
            p.grad = None if c == 0 else self.average(g).view_as(p)

    def gather_full_params(self, grads: bool = False) -> dict[str, torch.Tensor]:
        """Collective: ``{name: full tensor}`` in the master dtype, under the wrapped module's names
        (``grads=True``: their averaged gradients, e.g. to compare with one process)."""
        full = [[g.full_master(grads) for g in gs] for gs in self.units]
        return {name: (full[w[0]][w[1]][w[2]] if isinstance(w, tuple) else
                       (w.grad if grads else w).detach().clone()) for name, w in self._layout}
