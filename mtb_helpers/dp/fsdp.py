"""ZeRO stage 3 in notebook 06: notebook 14's ``FSDP`` wrapper with prefetch off, one unit per
linear layer, stepped by the course's Adam; ``STRATEGY_CLASSES``, the class each strategy name
selects, and ``build_strategy``, which builds it on a rank.

The sharding is all ``FSDP``'s (``fsdp_wrapper.py``, ``fsdp_units.py``: each ``nn.Linear``'s flat
``[weight, bias]`` padded to a multiple of ``p``, rank r keeping the r-th slice). ``ZeRO3Step`` only
puts the check's start state in place and runs the steps: Adam updates each shard with its
gradient and state shards; no collective is needed after the step.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from mtb_helpers.checking.bug import Bug, swap
from mtb_helpers.dp.fsdp_wrapper import FSDP
from mtb_helpers.dp.overlap import OverlappedDDP
from mtb_helpers.dp.sharded_optimizer import ShardedOptimizer
from mtb_helpers.dp.strategies import SHARDED, Adam, FlatShards, FlatStep, Strategy, ZeRO1, ZeRO2

__all__ = ["ZeRO3Step", "STRATEGY_CLASSES", "build_strategy"]


class ZeRO3Step(Strategy):
    """One ``FSDP(prefetch=False)`` (or ``wrapper``, a wrong one a bug puts in its place) over a
    copy of ``model`` (a ``Sequential`` of linear layers and activations), from ``start`` as
    ``FlatStep`` takes it (flat ``[Ψ]`` tensors and the step), stepped by ``adam``."""
    name = "zero3"

    def __init__(self, wrapper: type[FSDP], model: nn.Sequential, start: dict, adam: Adam = Adam(),
                 group=None):
        model = copy.deepcopy(model)
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(start["params"].clone(), model.parameters())
        self.fsdp = wrapper(model, prefetch=False, process_group=group)
        self.p, self.rank = self.fsdp.world_size, self.fsdp.rank
        self.net = self.fsdp
        self.shards = self.owned = list(self.fsdp.flat_shards)   # one [n_pad/p] per unit, layer order
        self.layout = FlatShards(tuple(g.numel for gs in self.fsdp.units for g in gs), self.p, True)
        self.optimizer = adam.make(self.shards)
        for k in ("exp_avg", "exp_avg_sq"):
            mine = self.layout.piece(start[k], self.rank, sharded=True).split(
                [len(s) for s in self.shards])
            for shard, piece in zip(self.shards, mine):
                self.optimizer.state.setdefault(shard, {"step": torch.tensor(float(start["step"]))})
                self.optimizer.state[shard][k] = piece.clone()
        # the largest unit gathered at once (its memory exists only while the unit computes)
        self.gathered_bytes = max(g.gather_bytes for gs in self.fsdp.units for g in gs)

    def zero_grad(self) -> None:
        """Each shard's grad: gone, so the next backward does not add to the reduced one."""
        self.fsdp.zero_grad()

    def reduce_gradients(self) -> None:
        """Wait for the units' reduce-scatters (issued during the backward) and average them."""
        self.fsdp.finish_gradient_synchronization()

    def pieces(self) -> dict[str, torch.Tensor]:
        states = [self.optimizer.state[p] for p in self.shards]
        return {"params": torch.cat([p.detach() for p in self.shards]),
                "grads": torch.cat([p.grad for p in self.shards]),
                **{k: torch.cat([s[k] for s in states]) for k in ("exp_avg", "exp_avg_sq")}}


# the class each strategy name selects; "ddp" and "zero3" select the wrapper itself (FlatStep and
# ZeRO3Step run it)
STRATEGY_CLASSES = {"ddp": OverlappedDDP, "zero1": ZeRO1, "zero2": ZeRO2, "zero3": FSDP}
assert tuple(STRATEGY_CLASSES) == tuple(SHARDED)


def build_strategy(strategy: str, model: nn.Module, start: dict, adam: Adam = Adam(),
                   bug: Bug | None = None, group=None, copy_model: bool = True) -> Strategy:
    """Inside a rank: the strategy object (``OverlappedDDP`` run by ``FlatStep``, ``ZeRO1`` or
    ``ZeRO2`` stepping ``ShardedOptimizer``, or ``FSDP`` run by ``ZeRO3Step``) for this rank, or
    the wrong one that ``bug`` (a ``Bug`` of ``BUGS``) puts in its place. ``copy_model=False``:
    ``model`` itself is trained (the capstone's stage, whose layers hold process groups)."""
    cls = swap(bug, STRATEGY_CLASSES[strategy])
    if strategy == "zero3":
        return ZeRO3Step(cls, model, start, adam, group)
    if strategy == "ddp":
        return FlatStep(cls, model, start, adam, group, copy_model)
    return cls(swap(bug, ShardedOptimizer), model, start, adam, group, copy_model)
