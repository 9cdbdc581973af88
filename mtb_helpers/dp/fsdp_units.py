"""One FSDP unit's flat parameters: the rank's shard (the fp32 master an optimizer steps) and the
gathered full tensor, whose memory exists only while the unit computes.

A unit (a module ``FSDP``'s ``shard`` predicate selected) has one ``FlatGroup`` per (dtype,
trainable) kind of parameter it manages. Its parameters are laid end to end in one flat vector of
``n`` elements, padded to ``n_pad`` (a multiple of ``p``); rank ``r`` keeps the slice
``[r·n_pad/p, (r+1)·n_pad/p)`` as ``shard``, an ``nn.Parameter``. ``full`` is a leaf tensor
``[n_pad]`` in the compute dtype whose storage is allocated for an all-gather and freed (resized to
0 bytes) afterwards; the modules get views of it as their ``weight``/``bias`` for the forward, and
the views autograd saved for the backward see the re-gathered values (FSDP1's flat parameter idea).
The gradient of ``full`` arrives once per backward (its ``AccumulateGrad`` waits for every view).
``find_units`` lists the units: the modules ``FSDP``'s ``shard`` predicate selects.
"""
from __future__ import annotations

import torch
from torch import nn

from mtb_helpers.comm.records import note
from mtb_helpers.dp.wrapping import all_gather_async, reduce_scatter_async

__all__ = ["FlatGroup", "find_units"]


class FlatGroup:
    """The flat parameters of one kind in one unit (see the module docstring)."""

    def __init__(self, unit: str, params: list[nn.Parameter], places: list[list[tuple[nn.Module, str]]],
                 world_size: int, rank: int, compute_dtype: torch.dtype | None, process_group) -> None:
        self.unit, self.places = unit, places
        self.shapes = [p.shape for p in params]
        self.numels = [p.numel() for p in params]
        self.p, self.pg = world_size, process_group
        self.numel = sum(self.numels)
        self.padded = -(-self.numel // world_size) * world_size
        self.trainable = params[0].requires_grad
        master = params[0].dtype
        self.compute_dtype = compute_dtype or master
        flat = torch.zeros(self.padded, dtype=master, device=params[0].device)      # [n_pad]
        torch.cat([p.detach().reshape(-1) for p in params], out=flat[:self.numel])
        per = self.padded // world_size
        self.shard = nn.Parameter(flat[rank * per:(rank + 1) * per].clone(),
                                  requires_grad=self.trainable)                    # [n_pad/p]
        self.full = torch.empty(self.padded, dtype=self.compute_dtype, device=flat.device)
        self.full.requires_grad_(self.trainable)
        self._free()
        self.gathered = False
        self.pending = None          # (work, send buffer) of an all-gather in flight
        for locs in places:          # the modules now read plain tensors, set before each use
            for module, attr in locs:
                module._parameters.pop(attr, None)

    @property
    def gather_bytes(self) -> int:
        """Bytes of the gathered ``full`` (what an all-gather fills on every rank)."""
        return self.padded * self.full.element_size()

    def _free(self) -> None:
        self.full.untyped_storage().resize_(0)

    def start_gather(self, direction: str = "forward") -> object:
        """Issue the all-gather of every rank's shard, cast first (half the bytes in bf16)."""
        if self.gathered or self.pending is not None:
            return None
        self.full.untyped_storage().resize_(self.padded * self.full.element_size())
        send = self.shard.detach().to(self.compute_dtype)                          # [n_pad/p]
        # .data: the collective writes the storage without touching autograd's version counter,
        # so the views saved in the forward stay valid when they are re-gathered for the backward
        work = all_gather_async(self.full.data, send, self.pg)                     # -> [n_pad]
        note("all_gather", send, self.full.data, "fsdp-params", self.unit, direction, self.p)
        self.pending = (work, send)
        return work

    def wait_gather(self, set_views: bool) -> None:
        """Make ``full`` hold the gathered values; with ``set_views`` give the modules views of it
        (in the forward, under autograd, so their gradients flow into ``full``)."""
        if self.pending is not None:
            self.pending[0].wait()
            self.pending = None
        self.gathered = True
        if set_views:
            views = self.full[:self.numel].split(self.numels)
            for view, shape, locs in zip(views, self.shapes, self.places):
                for module, attr in locs:
                    setattr(module, attr, view.view(shape))

    def reshard(self) -> None:
        """Free the gathered parameters (the views stay, pointing at no memory until the next gather)."""
        if self.pending is not None:
            self.pending[0].wait()
            self.pending = None
        if self.gathered:
            self._free()
            self.gathered = False

    def reduce_grad(self, grad: torch.Tensor, reduce_dtype: torch.dtype):
        """Start the reduce-scatter of ``grad [n_pad]`` in ``reduce_dtype``; returns
        ``(work, out [n_pad/p], send)``: ``out`` is the sum over ranks of this rank's slice once
        ``work`` is done; ``send`` must stay alive until then."""
        send = grad.to(reduce_dtype)
        out = send.new_empty(self.padded // self.p)
        work = reduce_scatter_async(out, send, self.pg)
        note("reduce_scatter", send, out, "fsdp-grads", self.unit, "backward", self.p)
        return work, out, send

    def full_master(self, grads: bool = False) -> list[torch.Tensor]:
        """Every rank's master shard (``grads``: its averaged gradient, zeros before any) gathered
        (synchronously, master dtype), one tensor per parameter."""
        mine = self.shard
        if grads:
            mine = self.shard.grad if self.shard.grad is not None else torch.zeros_like(self.shard)
        out = self.shard.new_empty(self.padded)
        all_gather_async(out, mine.detach().contiguous(), self.pg).wait()
        return [v.view(s).clone() for v, s in zip(out[:self.numel].split(self.numels), self.shapes)]


def find_units(root: nn.Module, select) -> tuple[list[tuple[str, nn.Module]], dict]:
    """The selected modules in order, and for every module the index of its nearest selected
    ancestor-or-self (-1: none)."""
    units: list[tuple[str, nn.Module]] = []
    owner: dict[nn.Module, int] = {}

    def walk(m: nn.Module, name: str, current: int) -> None:
        if m in owner:
            return
        if select(m):
            units.append((name, m))
            current = len(units) - 1
        owner[m] = current
        for child_name, child in m.named_children():
            walk(child, f"{name}.{child_name}" if name else child_name, current)

    walk(root, "", -1)
    return units, owner
