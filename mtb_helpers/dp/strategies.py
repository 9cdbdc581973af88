"""Data parallelism on flat buffers: DDP, ZeRO-1 and ZeRO-2 (ZeRO-3 is the ``FSDP`` wrapper, see ``fsdp.py``).

Every rank holds a replica of a small MLP (``fc1 [h -> ffn]``, GeLU, ``fc2 [ffn -> h]``) and runs
forward and backward on its slice of the batch, ``X_r = X[r*b/p:(r+1)*b/p]`` ``[b/p, h]``. The
loss is the mean over the slice, so the **average** of the ranks' gradients is the gradient of the
whole batch. What the strategies differ in is who keeps what (Rajbhandari et al. 2020, "ZeRO"):

    strategy  parameters   gradients                optimizer state (Adam)        collectives per step
    ddp       all Ψ        all Ψ                    all Ψ                        all-reduce grads
    zero1     all Ψ        all Ψ (own shard summed) shard Ψ/p                    reduce-scatter grads, all-gather params
    zero2     all Ψ        shard Ψ/p                shard Ψ/p                    reduce-scatter grads, all-gather params
    zero3     shard Ψ/p    shard Ψ/p                shard Ψ/p                    all-gather params (fwd
                                                                             and bwd), reduce-scatter grads

Parameters live in one flat buffer ``[Ψ_pad]`` (the module's tensors are views into it, like DDP's
gradient buckets), padded with zeros to a multiple of ``p`` when it is sharded, so any parameter
count works; the padding stays zero through Adam (zero grad, zero state). Each rank's shard is the
contiguous ``[r*Ψ_pad/p, (r+1)*Ψ_pad/p)``. Every collective is a plain ``torch.distributed`` call,
named in the record with ``comm.records.note`` (direction ``"backward"`` for grads, ``"step"`` for
the all-gather after the optimizer). One rank (or one process, no ``torch.distributed``) has
nothing to exchange: the call is skipped and still named, so the record has the same shape at
every world size.

Each training step starts with ``zero_grad()``: autograd *adds* into ``.grad``, so without it the
second step would use ``g1 + g2`` (the reduced ``g1`` still sits in the bucket).
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from mtb_helpers.comm.mesh import group_rank, group_size
from mtb_helpers.comm.records import note
from mtb_helpers.comm.regions import _REDUCE_SCATTER   # torch 2.13's name, or older torch's
from mtb_helpers.dp.adam import Adam, AdamUpdate

__all__ = ["STRATEGIES", "SHARDED", "Adam", "make_mlp", "flat", "rank_rows", "as_views", "padded_numel", "FlatShards",
           "held_bytes", "Strategy", "FlatStep", "ZeRO1", "ZeRO2"]

STRATEGIES = ("ddp", "zero1", "zero2", "zero3")
# which of the compared quantities each strategy keeps only a shard of
SHARDED = {"ddp": (), "zero1": ("grads", "exp_avg", "exp_avg_sq"), "zero2": ("grads", "exp_avg", "exp_avg_sq"),
           "zero3": ("params", "grads", "exp_avg", "exp_avg_sq")}
# The ZeRO paper's memory terms, and which of them each strategy keeps only 1/p of (ZeRO-1 keeps
# the full local gradient buffer).
MEMORY_TERMS = ("params", "grads", "optimizer_state")
MEMORY_SHARDED = {"ddp": (), "zero1": ("optimizer_state",), "zero2": ("grads", "optimizer_state"),
                  "zero3": MEMORY_TERMS}


def make_mlp(hidden: int, ffn_hidden: int, gen: torch.Generator, dtype: torch.dtype) -> nn.Sequential:
    """``Sequential(fc1 [h -> ffn], GELU, fc2 [ffn -> h])``, weights ~ N(0, 1/in), biases ~ N(0, 0.1²)."""
    model = nn.Sequential(nn.Linear(hidden, ffn_hidden, dtype=dtype), nn.GELU(),
                          nn.Linear(ffn_hidden, hidden, dtype=dtype))
    with torch.no_grad():
        for lin in (model[0], model[2]):
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen, dtype=dtype)
                             / lin.in_features ** 0.5)
            lin.bias.copy_(0.1 * torch.randn(lin.out_features, generator=gen, dtype=dtype))
    return model


def flat(tensors) -> torch.Tensor:
    """The tensors (a DTensor gathered whole) flattened and concatenated, in order: ``[sum of numel]``."""
    return torch.cat([(t.full_tensor() if hasattr(t, "full_tensor") else t).detach().reshape(-1)
                      for t in tensors])


def rank_rows(batches: list, t: int, r: int) -> list:
    """Rank ``r`` of ``t``'s rows ``X_r [b/t, ...]`` of each ``(x, y)`` batch ``[b, ...]``."""
    return [(x[r * (len(x) // t):(r + 1) * (len(x) // t)], y[r * (len(y) // t):(r + 1) * (len(y) // t)])
            for x, y in batches]


def as_views(params, buffer: torch.Tensor) -> None:
    """The parameters become views of ``buffer`` ``[>= Ψ]``, in order (their values: the buffer's)."""
    offset = 0
    for param in params:
        param.data = buffer[offset:offset + param.numel()].view_as(param)
        offset += param.numel()


def padded_numel(numel: int, p: int) -> int:
    """``numel`` rounded up to a multiple of ``p``: the flat buffer every rank can shard evenly."""
    return -(-numel // p) * p


@dataclass(frozen=True)
class FlatShards:
    """The flat units a strategy lays the ``Ψ`` parameters out in (one for DDP/ZeRO-1/2, one per
    linear layer for ZeRO-3) and which piece of each unit rank ``r`` holds (a parallel layout
    is ``plan.specs.Layout``)."""
    units: tuple[int, ...]      # parameter count of each unit
    world_size: int
    pad: bool                   # pad each unit to a multiple of the world size

    def padded(self, i: int) -> int:
        return padded_numel(self.units[i], self.world_size) if self.pad else self.units[i]

    @property
    def numel(self) -> int:
        return sum(self.units)

    @property
    def padded_numel(self) -> int:
        return sum(self.padded(i) for i in range(len(self.units)))

    def shard(self, i: int, rank: int) -> tuple[int, int]:
        n = self.padded(i) // self.world_size
        return rank * n, (rank + 1) * n

    def piece(self, vec: torch.Tensor, rank: int, sharded: bool) -> torch.Tensor:
        """Rank ``rank``'s piece of a full ``[Ψ]`` vector: every unit zero-padded, then its shard
        (``sharded``) or all of it, concatenated over units."""
        out, start = [], 0
        for i, n in enumerate(self.units):
            unit = torch.zeros(self.padded(i), dtype=vec.dtype)
            unit[:n] = vec[start:start + n]
            start += n
            lo, hi = self.shard(i, rank) if sharded else (0, len(unit))
            out.append(unit[lo:hi])
        return torch.cat(out)


def held_bytes(tensors) -> int:
    """Bytes of the distinct storages the tensors keep alive (views of one buffer count once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None:
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


class Strategy:
    """One data-parallel training step, whatever is sharded: forward and backward on this rank's
    slice of the batch, gradients reduced (how is the subclass's business), one Adam step.
    Subclasses set ``p`` (the group size: the data-parallel world size), ``net`` (the module the
    forward runs), ``owned`` (the parameters whose storage and gradients this rank holds) and
    ``optimizer``."""

    def forward_backward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Loss (mean squared error) of this rank's slice ``x, target [b/p, h]``, then backward."""
        loss = nn.functional.mse_loss(self.net(x), target)
        loss.backward()
        return loss.detach()

    def held(self) -> dict[str, int]:
        """Bytes this rank holds for parameters, gradients and optimizer state (Adam's m and v;
        the 4-byte step counter is left out, as the ZeRO paper does)."""
        return {"params": held_bytes(self.owned),
                "grads": held_bytes([param.grad for param in self.owned]),
                "optimizer_state": held_bytes(v for s in self.optimizer.state.values()
                                              for k, v in s.items() if k != "step")}

    def average(self, summed: torch.Tensor) -> torch.Tensor:
        """The sum over ranks -> the mean: each rank's loss is the mean over its b/p samples."""
        return summed / self.p

    def step(self) -> None:
        """One Adam step on what this rank owns."""
        self.optimizer.step()

    def zero_grad(self) -> None:
        """Drop every gradient this rank holds (the subclass knows where they live)."""
        raise NotImplementedError

    def train_step(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """One step: clear the gradients, forward and backward, reduce, Adam. Returns the loss."""
        self.zero_grad()
        loss = self.forward_backward(x, target)
        self.reduce_gradients()
        self.step()
        return loss


class FlatStep(Strategy):
    """Notebook 06's DDP and ZeRO-1/2: the module's parameters are views of one flat buffer
    ``[Ψ_pad]``, and Adam steps ``master``, this rank's slice of it (all of it under DDP, where
    ``wrapper``, ``OverlappedDDP`` without overlap, all-reduces the gradients after the backward).

    ``start`` holds flat ``[Ψ]`` tensors ``params``, ``exp_avg``, ``exp_avg_sq`` and the int
    ``step``: the state after the steps already taken (the same on every rank).
    """
    name = "ddp"
    shard_optimizer = False   # ZeRO-1 and ZeRO-2: Adam updates only this rank's shard
    keep_full_grads = True    # ZeRO-2 frees the full gradient once it is reduce-scattered

    def __init__(self, wrapper: type, model: nn.Module, start: dict, adam: Adam = Adam(), group=None,
                 copy_model: bool = True):
        self.group, self.p, self.rank = group, group_size(group), group_rank(group)
        # copy_model=False: the caller's module itself gets the flat buffer (its layers may hold
        # process groups, which cannot be deep-copied)
        self.model = copy.deepcopy(model) if copy_model else model
        # walked once (~0.3 ms on the capstone's stage): only their .data changes (test_dp_params_kept)
        self._params = params = list(self.model.parameters())
        self.layout = FlatShards((sum(param.numel() for param in params),), self.p, self.shard_optimizer)
        self.flat = self.layout.piece(start["params"], 0, sharded=False)   # [Ψ_pad]
        as_views(params, self.flat)
        if self.shard_optimizer:   # ZeRO-1/2: ``wrapper`` is ShardedOptimizer, over the p shards
            self.ddp = None
            shards = [nn.Parameter(self.flat[slice(*self.layout.shard(0, r))]) for r in range(self.p)]
            # equal sizes: partition_by_size gives shard r to rank r
            self.optimizer = wrapper(shards, AdamUpdate, group, **dataclasses.asdict(adam))
            self.master = shards[self.rank]
        else:   # DDP: ``wrapper`` is OverlappedDDP; every rank starts from ``start``, no broadcast
            self.ddp = wrapper(self.model, process_group=group, overlap=False, init_sync=False)
            self.master = nn.Parameter(self.flat)          # shares the flat buffer's storage
            self.optimizer = adam.make([self.master])
        self.own = self.layout.shard(0, self.rank) if self.shard_optimizer else (0, len(self.flat))
        self.net = self.model if self.ddp is None else self.ddp
        self.owned = [*params, self.master]
        self.load(start)

    def load(self, start: dict) -> None:
        """Put the state ``start`` (as ``__init__`` takes it) in place: the parameters into the flat
        buffer (the module's parameters are its views), Adam's moments of this rank's slice and the
        step; gradients dropped. What training leaves behind is then gone, so a caller may keep
        the strategy and its module between runs (the capstone's ranks do)."""
        lo, hi = self.own
        with torch.no_grad():
            self.flat.copy_(self.layout.piece(start["params"], 0, sharded=False))
        self.optimizer.state[self.master] = {
            "step": torch.tensor(float(start["step"])),
            **{k: self.layout.piece(start[k], 0, sharded=False)[lo:hi].clone()
               for k in ("exp_avg", "exp_avg_sq")}}
        self.zero_grad()

    def _full_grads(self) -> torch.Tensor:
        """This rank's own (not yet reduced) gradient as one flat buffer ``[Ψ_pad]``; the module's
        ``.grad`` become views of it, so only one copy is held."""
        params, n = self._params, self.layout.numel
        buffer = torch.empty_like(self.flat)
        torch.cat([param.grad.reshape(-1) for param in params], out=buffer[:n])
        buffer[n:].zero_()   # the padding
        for param, part in zip(params, buffer[:n].split([param.numel() for param in params])):
            param.grad = part.view_as(param)
        return buffer

    def zero_grad(self) -> None:
        """The module's ``.grad`` (views of last step's bucket) and the optimizer's grad: gone, so
        the next backward writes fresh gradients instead of adding to the reduced ones."""
        if self.ddp is not None:
            self.ddp.zero_grad()     # nn.Module's (set to None), or a bug's in front of it
        else:
            for param in self._params:
                param.grad = None
        self.master.grad = None

    def reduce_gradients(self) -> None:
        """DDP: the wrapper all-reduces and averages the gradients; the optimizer's grad is all
        of them, one flat ``[Ψ]`` (the module's ``.grad`` become its views)."""
        self.ddp.finish_gradient_synchronization()
        self.master.grad = self._full_grads()

    def pieces(self) -> dict[str, torch.Tensor]:
        """What this rank holds of each compared quantity (full ``[Ψ_pad]`` or its shard)."""
        state = self.optimizer.state[self.master]
        return {"params": self.flat.clone(), "grads": self.master.grad.detach().clone(),
                "exp_avg": state["exp_avg"].clone(), "exp_avg_sq": state["exp_avg_sq"].clone()}


class ZeRO1(FlatStep):
    """ZeRO stage 1 (P_os): Adam's state sharded. Gradients are reduce-scattered (each rank needs
    the averaged gradient of its shard only) into the rank's slice of the full local gradient
    buffer, which stays allocated; ``ShardedOptimizer`` (notebook 14's) steps the shard and
    all-gathers the updated parameters."""
    name = "zero1"
    shard_optimizer = True

    def reduce_gradients(self) -> None:
        buffer = self._full_grads()                       # [Ψ_pad]
        lo, hi = self.own
        summed = buffer.new_empty(hi - lo) if self.p > 1 else buffer.clone()   # [Ψ_pad/p]
        if self.p > 1:   # reduce-scatter: [Ψ_pad] on every rank -> this rank's [Ψ_pad/p] of the sum
            getattr(dist, _REDUCE_SCATTER)(summed, buffer, group=self.group)
        note("reduce_scatter", buffer, summed, "zero_grad_reduce_scatter", "", "backward", self.p)
        shard = self.average(summed)
        if self.keep_full_grads:
            buffer[lo:hi] = shard        # the summed shard overwrites this rank's own slice
            self.master.grad = buffer[lo:hi]
        else:
            self.master.grad = shard.clone()   # its own storage, so the full buffer is freed
            for param in self._params:
                param.grad = None


class ZeRO2(ZeRO1):
    """ZeRO stage 2 (P_os+g): gradients sharded too; the full local gradient is freed as soon as
    it is reduce-scattered. (DeepSpeed reduces bucket by bucket during backward, so the full
    gradient never exists at once; here it does, briefly, before the reduce-scatter.)"""
    name = "zero2"
    keep_full_grads = False
