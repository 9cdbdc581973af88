"""``ShardedOptimizer``: ZeRO stage 1 as an ordinary ``torch.optim.Optimizer``.

    opt = ShardedOptimizer(ddp.parameters(), torch.optim.AdamW, lr=1e-3)   # inside a rank
    ...; ddp.finish_gradient_synchronization(); opt.step(); opt.zero_grad()

Every rank holds the whole model and the whole averaged gradient (DDP's all-reduce gives it), but
the optimizer state (AdamW's m and v: 2Ψ values) only for its partition of the parameters
(Rajbhandari et al., "ZeRO", SC 2020, stage P_os): the parameters are split across the ``t`` ranks
balanced by size (largest first, each to the rank holding the fewest elements so far, as PyTorch's
``ZeroRedundancyOptimizer`` does), each rank steps its partition with a local ``optimizer_cls``,
and one all-gather then gives every rank every updated parameter (ZeRO-1's extra collective; the
partitions are padded to the largest one so that it is a single all-gather per dtype).
``param_groups`` are the whole model's (a learning-rate scheduler changes them; each ``step`` passes
them on to the local optimizer); ``zero_grad`` clears every gradient. ``state_dict()`` is collective
(call it on every rank): it returns the state the unsharded ``optimizer_cls`` would hold, indexed the
same way; ``load_state_dict`` takes such a dict and keeps this rank's partition of it.
``state`` is this rank's partition's (the local optimizer's), and ``local_state_bytes()`` what it
occupies, about 1/p of the unsharded.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from mtb_helpers.comm.records import note
from mtb_helpers.dp.adam import AdamUpdate
from mtb_helpers.dp.wrapping import all_gather_async, check_group

__all__ = ["ShardedOptimizer", "partition_by_size", "state_bytes"]


def partition_by_size(numels: list[int], world_size: int) -> list[int]:
    """The owning rank of each parameter: largest first (stable), each to the least-loaded rank."""
    owner, load = [0] * len(numels), [0] * world_size
    for i in sorted(range(len(numels)), key=lambda i: -numels[i]):
        r = load.index(min(load))
        owner[i], load[r] = r, load[r] + numels[i]
    return owner


def state_bytes(state: dict) -> int:
    """Bytes of the tensors in an optimizer's ``state`` (``{param: {name: value}}``)."""
    return sum(v.numel() * v.element_size() for s in state.values() for v in s.values()
               if torch.is_tensor(v))


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1: optimizer state sharded across ranks; see the module docstring."""

    def __init__(self, params, optimizer_cls: type, process_group=None, **kwargs) -> None:
        if not (isinstance(optimizer_cls, type)
                and issubclass(optimizer_cls, (torch.optim.Optimizer, AdamUpdate))):
            raise ValueError(f"optimizer_cls must be a torch.optim.Optimizer class (e.g. "
                             f"torch.optim.AdamW) or dp.adam's AdamUpdate, got {optimizer_cls!r}")
        self.world_size, self.rank = check_group(process_group)
        self.process_group = process_group
        super().__init__(params, dict(kwargs))
        flat = [p for g in self.param_groups for p in g["params"]]
        devices = {p.device for p in flat}
        if len(devices) > 1:
            raise ValueError(f"params are on different devices ({', '.join(map(str, devices))})")
        self.owner = dict(zip(flat, partition_by_size([p.numel() for p in flat], self.world_size)))
        local_groups = [{**{k: v for k, v in g.items() if k != "params"},
                         "params": [p for p in g["params"] if self.owner[p] == self.rank]}
                        for g in self.param_groups]
        self.local = optimizer_cls(local_groups, **kwargs)
        self.state = self.local.state            # this rank's partition's state, as torch's holds it
        for mine, local in zip(self.param_groups, self.local.param_groups):
            for k, v in local.items():           # the optimizer's own defaults (betas, eps, ...)
                mine.setdefault(k, v)

    def add_param_group(self, param_group: dict) -> None:
        """One group of the whole model's, with the defaults filled in (the local optimizer checks
        the hyper-parameters). torch's own is wrapped by ``torch._disable_dynamo``, whose first
        call imports ``torch._dynamo`` (~1 s, ~35 MB a rank): notebook 06's ZeRO-1, the capstone
        and ``check_plan`` step this class with the written-out ``AdamUpdate`` and never need it."""
        params = param_group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        self.param_groups.append({**self.defaults, **param_group, "params": params})

    def partition(self) -> list[list[int]]:
        """For each rank, the indices (in ``param_groups`` order) of the parameters it steps."""
        flat = [p for g in self.param_groups for p in g["params"]]
        return [[i for i, p in enumerate(flat) if self.owner[p] == r] for r in range(self.world_size)]

    @torch.no_grad()
    def step(self, closure=None):
        """Step this rank's partition with the local optimizer, then share every partition."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for mine, local in zip(self.param_groups, self.local.param_groups):
            local.update({k: v for k, v in mine.items() if k != "params"})
        self.local.step()
        self._share_partitions()
        return loss

    def _share_partitions(self) -> None:
        """All-gather the updated partitions: each rank's ``[max partition]`` slice, per dtype."""
        flat = [p for g in self.param_groups for p in g["params"]]
        for dtype in dict.fromkeys(p.dtype for p in flat):
            per_rank = [[p for p in flat if p.dtype == dtype and self.owner[p] == r]
                        for r in range(self.world_size)]
            width = max(sum(p.numel() for p in ps) for ps in per_rank)
            mine = torch.zeros(width, dtype=dtype, device=flat[0].device)      # [max partition]
            if per_rank[self.rank]:
                own = torch.cat([p.reshape(-1) for p in per_rank[self.rank]])
                mine[:own.numel()] = own
            out = mine.new_empty(self.world_size * width)                     # [world_size * max partition]
            if self.world_size > 1:   # a group of one: nothing to send, the record still names it
                all_gather_async(out, mine, self.process_group).wait()
            note("all_gather", mine, out, "zero_param_all_gather", "", "step", self.world_size)
            for r, ps in enumerate(per_rank):
                if r != self.rank and ps:
                    vals = out[r * width:r * width + sum(p.numel() for p in ps)]
                    for p, v in zip(ps, vals.split([p.numel() for p in ps])):
                        p.copy_(v.view_as(p))

    def local_state_bytes(self) -> int:
        """Bytes of the tensors in this rank's optimizer state (its partition only)."""
        return state_bytes(self.local.state)

    def state_dict(self) -> dict:
        """Collective: the unsharded optimizer's state dict, gathered from every rank's partition."""
        flat = [p for g in self.param_groups for p in g["params"]]
        index = {p: i for i, p in enumerate(flat)}
        mine = {index[p]: copy.deepcopy(s) for p, s in self.local.state.items()}
        parts: list = [None] * self.world_size
        dist.all_gather_object(parts, mine, group=self.process_group)
        state = {i: s for part in parts for i, s in part.items()}
        groups = [{**{k: v for k, v in g.items() if k != "params"},
                   "params": [index[p] for p in g["params"]]} for g in self.param_groups]
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Take an unsharded state dict (``state_dict()``'s, or ``optimizer_cls``'s own) and keep
        this rank's partition of the state; hyperparameters go to every group."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(g["params"]) != len(m["params"]) for g, m in zip(groups, self.param_groups)):
            raise ValueError("state_dict's param_groups do not match this optimizer's")
        flat = [p for g in self.param_groups for p in g["params"]]
        position = dict(zip([i for g in groups for i in g["params"]], flat))
        local_flat = [p for g in self.local.param_groups for p in g["params"]]
        local_index = {p: i for i, p in enumerate(local_flat)}
        local_state = {local_index[position[int(i)]]: s for i, s in state_dict["state"].items()
                       if self.owner[position[int(i)]] == self.rank}
        local_groups = []
        for g, mine, local in zip(groups, self.param_groups, self.local.param_groups):
            hyper = {k: v for k, v in g.items() if k != "params"}
            mine.update(hyper)
            local_groups.append({**hyper, "params": [local_index[p] for p in local["params"]]})
        self.local.load_state_dict({"state": local_state, "param_groups": local_groups})
        self.state = self.local.state            # torch's load_state_dict made a new dict
