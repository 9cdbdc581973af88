"""Notebook 14 in PyTorch's own API: the course's wrappers and PyTorch's, on the same ranks, step
for step, and one process on the whole batch.

    res = pytorch_overlap(world_size=2, wrapper="ddp", optimizer="adamw", bucket_cap_mb=0.0004)
    res["max_diff"]        # {"course vs pytorch": ..., "course vs one process": ..., ...} per step
    res["buckets"]         # ddp: the course's .buckets and DDP's (from a comm hook), by name

    course OverlappedDDP(bucket_cap_mb)          -> DistributedDataParallel(bucket_cap_mb=...)
    course OverlappedDDP + ShardedOptimizer      -> DDP + ZeroRedundancyOptimizer, and DDP + AdamW
    course FSDP(compute_dtype, reduce_dtype)     -> fully_shard(each nn.Linear), fully_shard(model)
                                                    under MixedPrecisionPolicy(param_dtype, reduce_dtype)

The model is ``overlap_model`` (fc1, GeLU, fc2, GeLU, a third linear layer, so that small caps
make several buckets); every rank trains on its rows ``[B/p, h]`` of each batch (mean-squared error).
DDP's buckets are read from a communication hook (``GradBucket.parameters()``), in the order DDP
reduces them; DDP rebuilds its buckets after the first step in the order gradients arrived, so the
last step's are compared. ZeRO-1's optimizer state per rank is measured in bytes on each side.
"""
from __future__ import annotations

import copy
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mtb_helpers.checking.tolerances import divisible
from mtb_helpers.dp.buckets import bucket_cap_bytes
from mtb_helpers.dp.fsdp_wrapper import FSDP
from mtb_helpers.dp.overlap import OverlappedDDP
from mtb_helpers.dp.sharded_optimizer import ShardedOptimizer, state_bytes
from mtb_helpers.dp.strategies import flat, rank_rows
from mtb_helpers.runtime.compat import zero_partition
from mtb_helpers.runtime.ranks import resolve_world_size, run

__all__ = ["pytorch_overlap", "overlap_model", "OPTIMIZERS", "WRAPPERS"]

OPTIMIZERS = {"sgd": (torch.optim.SGD, {"lr": 0.1}), "adamw": (torch.optim.AdamW, {"lr": 0.01})}
WRAPPERS = ("ddp", "zero1", "fsdp")
# DDP's cap for the course's bucket_cap_mb=0 (one bucket per parameter): one byte buckets the same
# way, and torch 2.11 (Colab) refuses 0 ("bucket_cap_mb should be set by now"); 2.13 takes either
ONE_BYTE_MB = 2.0 ** -20


def overlap_model(hidden: int, dtype: torch.dtype, seed: int) -> nn.Sequential:
    """``[B, h] -> [B, h]``: Linear(h, 4h), GeLU, Linear(4h, h), GeLU, Linear(h, h)."""
    gen = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden),
                          nn.GELU(), nn.Linear(hidden, hidden)).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=dtype) * p.numel() ** -0.25)
    return model


def _ddp(model, bucket_cap_mb):
    from torch.nn.parallel import DistributedDataParallel
    seen: list[list[str]] = []
    names = {p: n for n, p in model.named_parameters()}

    def hook(state, bucket):                 # DDP's own all-reduce, after noting the bucket
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        seen.append([names[p] for p in bucket.parameters()])
        return allreduce_hook(None, bucket)

    ddp = DistributedDataParallel(model, bucket_cap_mb=max(bucket_cap_mb, ONE_BYTE_MB))
    ddp.register_comm_hook(None, hook)
    return ddp, seen


def _on_rank(wrapper, model, batches, optimizer, bucket_cap_mb, compute_dtype, reduce_dtype):
    t, r = dist.get_world_size(), dist.get_rank()
    cls, kw = OPTIMIZERS[optimizer]
    rows = rank_rows(batches, t, r)
    out: dict = {"course": [], "pytorch": [], "unsharded": []}
    seen: list[list[str]] = []           # DDP's buckets, as its comm hook saw them
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mine = copy.deepcopy(model)
        if wrapper == "fsdp":
            ours = FSDP(mine, compute_dtype=compute_dtype, reduce_dtype=reduce_dtype)
            our_opt = cls(ours.parameters(), **kw)
            from torch.distributed.fsdp import MixedPrecisionPolicy

            # imported here: an owner that loads dp.pytorch preloads DTensor's debug on its ranks
            from mtb_helpers.dp.pytorch import fully_shard_linears
            policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=reduce_dtype)
            theirs = fully_shard_linears(copy.deepcopy(model), mp_policy=policy)
            their_opt = cls(theirs.parameters(), **kw)
            sides = [("course", ours, our_opt), ("pytorch", theirs, their_opt)]
        else:
            ours = OverlappedDDP(mine, bucket_cap_mb=bucket_cap_mb)
            theirs, seen = _ddp(copy.deepcopy(model), bucket_cap_mb)
            if wrapper == "zero1":
                from torch.distributed.optim import ZeroRedundancyOptimizer
                our_opt = ShardedOptimizer(ours.parameters(), cls, **kw)
                their_opt = ZeroRedundancyOptimizer(theirs.parameters(), optimizer_class=cls, **kw)
                plain = OverlappedDDP(copy.deepcopy(model), bucket_cap_mb=bucket_cap_mb)
                sides = [("course", ours, our_opt), ("pytorch", theirs, their_opt),
                         ("unsharded", plain, cls(plain.parameters(), **kw))]
            else:
                sides = [("course", ours, cls(ours.parameters(), **kw)),
                         ("pytorch", theirs, cls(theirs.parameters(), **kw))]
        per_step = []
        for x, y in rows:
            before = len(seen)
            for name, net, opt in sides:
                opt.zero_grad(set_to_none=True)
                F.mse_loss(net(x).to(y.dtype), y).backward()
                if hasattr(net, "finish_gradient_synchronization"):
                    net.finish_gradient_synchronization()
                opt.step()
                out[name].append(flat(ours.gather_full_params().values())
                                 if net is ours and wrapper == "fsdp" else flat(net.parameters()))
            per_step.append(seen[before:])
        if wrapper != "fsdp":
            out["buckets"] = {"course": ours.buckets, "pytorch": per_step[-1],
                              "pytorch_first_step": per_step[0]}
        if wrapper == "zero1":
            unsharded = sides[2][2]
            out["state_bytes"] = {
                "course": our_opt.local_state_bytes(),
                "pytorch": state_bytes(their_opt.optim.state),
                "unsharded": state_bytes(unsharded.state)}
            out["partition"] = {"course": our_opt.partition(),
                                "pytorch": zero_partition(their_opt, {p: i for i, p in
                                                                      enumerate(theirs.parameters())})}
    return out


def _one_process(model, batches, optimizer) -> list[torch.Tensor]:
    model = copy.deepcopy(model).double()
    cls, kw = OPTIMIZERS[optimizer]
    opt = cls(model.parameters(), **kw)
    out = []
    for x, y in batches:
        opt.zero_grad()
        F.mse_loss(model(x.double()), y.double()).backward()
        opt.step()
        out.append(flat(model.parameters()))
    return out


def pytorch_overlap(world_size: int = 2, wrapper: str = "ddp", optimizer: str = "adamw",
                    steps: int = 5, batch: int = 12, hidden: int = 8, bucket_cap_mb: float = 0.0004,
                    dtype: torch.dtype = torch.float64, compute_dtype: torch.dtype | None = None,
                    reduce_dtype: torch.dtype | None = None, seed: int = 0, timeout: float = 120.0) -> dict:
    """The course's ``wrapper`` and PyTorch's on the same ranks for ``steps`` steps (see the module
    docstring). Returns ``{"max_diff": {pair: [per step]}, "buckets", "state_bytes", "partition",
    "world_size", ...}``; a difference is the largest over ranks of ``max|a - b|`` of the flat
    parameters after the step."""
    t = resolve_world_size(world_size)
    if wrapper not in WRAPPERS:
        raise ValueError(f"unknown wrapper {wrapper!r}; expected one of {WRAPPERS}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; expected one of {sorted(OPTIMIZERS)}")
    divisible("batch", batch, f"the world size {t}", t, "data parallelism gives every rank batch/p rows")
    bucket_cap_bytes(bucket_cap_mb)
    model = overlap_model(hidden, dtype, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    batches = [tuple(torch.randn(batch, hidden, generator=gen, dtype=dtype) for _ in range(2))
               for _ in range(steps)]
    results = run(_on_rank, wrapper, model, batches, optimizer, bucket_cap_mb, compute_dtype,
                  reduce_dtype, world_size=t, timeout=timeout)
    ref = _one_process(model, batches, optimizer)
    sides = [s for s in ("course", "pytorch", "unsharded") if results[0][s]]
    # the largest over ranks of max|a - b| after each step (b None: the one process)
    diff = lambda a, b: [max(float((res[a][k].double() - (ref[k] if b is None else res[b][k]).double())
                                   .abs().max()) for res in results) for k in range(steps)]
    max_diff = {"course vs pytorch": diff("course", "pytorch"),
                **{f"{s} vs one process": diff(s, None) for s in sides}}
    if "unsharded" in sides:
        max_diff["course vs unsharded"] = diff("course", "unsharded")
    out = {"max_diff": max_diff, "world_size": t, "wrapper": wrapper, "optimizer": optimizer,
           "steps": steps}
    for key in ("buckets", "state_bytes", "partition"):
        if key in results[0]:
            out[key] = [res[key] for res in results] if key == "state_bytes" else results[0][key]
    return out
