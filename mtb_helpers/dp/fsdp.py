"""ZeRO stage 3 / FSDP: parameters sharded too, gathered only while a layer runs.

Each linear layer is one unit: its ``[weight, bias]`` flattened and zero-padded to ``n_pad``
(a multiple of ``p``); rank r keeps only ``[r*n_pad/p, (r+1)*n_pad/p)`` as an ``nn.Parameter``.

    forward of a unit:  all-gather the shard -> [n_pad] -> W, bias;  Y = X @ W.T + bias;  free W, bias
    backward of a unit: all-gather again;  dX = dY @ W;  [dW, dbias] flat -> reduce-scatter, average
                        -> this rank's ``[n_pad/p]`` gradient shard;  free W, b

Autograd keeps the unit's input activation ``X`` for backward (as FSDP does), but not its
parameters: that is why backward gathers them a second time. Adam then updates each shard with
its gradient shard and state shard; no collective is needed after the step. Each collective is
a plain ``torch.distributed`` call named in the record with ``comm.records.note`` (skipped, and
still named, on one rank).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mtb_helpers.comm.mesh import group_rank, group_size
from mtb_helpers.comm.records import note
from mtb_helpers.dp.strategies import DDP, SHARDED, Adam, FlatShards, Strategy, ZeRO1, ZeRO2, held_bytes
from mtb_helpers.dp.wrapping import all_gather_async, reduce_scatter_async

__all__ = ["ZeRO3", "STRATEGY_CLASSES"]


class _ShardedLinear(torch.autograd.Function):
    """forward: all-gather the unit's params, ``X @ W.T + bias``; backward: all-gather them again,
    ``dX = dY @ W``, reduce-scatter the flat ``[dW, dbias]`` and average it into the shard's grad."""

    @staticmethod
    def forward(ctx, x, shard, owner, unit):
        w, bias = owner.gather(shard, unit, "forward")
        ctx.save_for_backward(x, shard)          # the input, not the gathered parameters
        ctx.owner, ctx.unit = owner, unit
        return F.linear(x, w, bias)

    @staticmethod
    def backward(ctx, dy):
        x, shard = ctx.saved_tensors
        owner, unit = ctx.owner, ctx.unit
        w, _ = owner.gather(shard, unit, "backward")
        dy2, x2 = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
        full = torch.zeros(owner.layout.padded(unit), dtype=dy.dtype)
        full[:owner.layout.units[unit]] = torch.cat([(dy2.T @ x2).reshape(-1), dy2.sum(0)])
        summed = full.new_empty(len(full) // owner.p)   # [n_pad/p]: this rank's shard of the sum
        if owner.p > 1:
            reduce_scatter_async(summed, full, owner.group).wait()
        else:
            summed.copy_(full)
        note("reduce_scatter", full, summed, "zero3_grad_reduce_scatter", "", "backward", owner.p)
        grad_shard = owner.average(summed).clone()   # own storage: the full [n_pad] is freed
        return dy @ w, grad_shard, None, None


class ZeRO3(Strategy):
    """ZeRO stage 3 (P_os+g+p), the scheme of PyTorch FSDP: parameters, gradients and Adam's state
    are all sharded; each linear layer's parameters are all-gathered before each use (forward and
    backward) and freed after. ``start`` as for ``DDP``."""
    name = "zero3"

    def __init__(self, model: nn.Sequential, start: dict, adam: Adam = Adam(), group=None):
        self.group, self.p, self.rank = group, group_size(group), group_rank(group)
        self.layers = list(model)
        self.linears = [i for i, m in enumerate(self.layers) if isinstance(m, nn.Linear)]
        self.shapes = [(self.layers[i].weight.shape, self.layers[i].bias.shape) for i in self.linears]
        self.layout = FlatShards(tuple(w.numel() + b.numel() for w, b in self.shapes), self.p, True)
        self.shards = nn.ParameterList()
        self.optimizer_start = {}
        for unit in range(len(self.linears)):
            lo, hi = self.layout.shard(unit, self.rank)
            self.shards.append(nn.Parameter(self._unit(start["params"], unit)[lo:hi].clone()))
            self.optimizer_start[unit] = {k: self._unit(start[k], unit)[lo:hi].clone()
                                          for k in ("exp_avg", "exp_avg_sq")}
        for i in self.linears:   # keep the layer's shape only: its full parameters are dropped
            self.layers[i] = None
        self.optimizer = adam.make(list(self.shards))
        for unit, param in enumerate(self.shards):
            self.optimizer.state[param] = {"step": torch.tensor(float(start["step"])),
                                       **self.optimizer_start.pop(unit)}
        self.gathered_bytes = 0   # the largest unit all-gathered at once (freed after use)

    def _unit(self, vec: torch.Tensor, unit: int) -> torch.Tensor:
        """Unit ``unit``'s slice of a full ``[Ψ]`` vector, zero-padded to ``[n_pad]``."""
        start = sum(self.layout.units[:unit])
        n = self.layout.units[unit]
        out = torch.zeros(self.layout.padded(unit), dtype=vec.dtype)
        out[:n] = vec[start:start + n]
        return out

    def gather(self, shard: torch.Tensor, unit: int, direction: str):
        """All-gather unit ``unit``'s parameters: ``[n_pad/p] -> [n_pad]`` -> ``(W, b)``."""
        mine = shard.detach()                                   # [n_pad/p]
        full = mine.new_empty(len(mine) * self.p)               # [n_pad]
        if self.p > 1:
            all_gather_async(full, mine, self.group).wait()
        else:
            full.copy_(mine)
        note("all_gather", mine, full, "zero3_param_all_gather", "", direction, self.p)
        self.gathered_bytes = max(self.gathered_bytes, full.numel() * full.element_size())
        (w_shape, b_shape), nw = self.shapes[unit], self.shapes[unit][0].numel()
        return full[:nw].view(w_shape), full[nw:nw + b_shape.numel()].view(b_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = (_ShardedLinear.apply(x, self.shards[self.linears.index(i)], self, self.linears.index(i))
                 if layer is None else layer(x))
        return x

    def forward_backward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(self.forward(x), target)
        loss.backward()
        return loss.detach()

    def zero_grad(self) -> None:
        """Each shard's grad: gone, so the next backward does not add to the reduced one."""
        for param in self.shards:
            param.grad = None

    def reduce_gradients(self) -> None:
        """Nothing left to do: each unit's backward reduce-scattered its gradient already."""

    def held(self) -> dict[str, int]:
        return {"params": held_bytes(self.shards),
                "grads": held_bytes(param.grad for param in self.shards),
                "optimizer_state": held_bytes(v for s in self.optimizer.state.values()
                                              for k, v in s.items() if k != "step")}

    def pieces(self) -> dict[str, torch.Tensor]:
        states = [self.optimizer.state[p] for p in self.shards]
        return {"params": torch.cat([p.detach() for p in self.shards]),
                "grads": torch.cat([p.grad for p in self.shards]),
                **{k: torch.cat([s[k] for s in states]) for k in ("exp_avg", "exp_avg_sq")}}


STRATEGY_CLASSES = {"ddp": DDP, "zero1": ZeRO1, "zero2": ZeRO2, "zero3": ZeRO3}
assert tuple(STRATEGY_CLASSES) == tuple(SHARDED)
