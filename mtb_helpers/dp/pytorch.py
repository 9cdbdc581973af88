"""Notebook 06 in PyTorch's own API: ``DistributedDataParallel`` and FSDP2 ``fully_shard``
against the course's DDP (``OverlappedDDP`` without overlap, run by ``FlatStep``) and ZeRO-3
(``FSDP``, run by ``ZeRO3Step``).

    res = pytorch_data_parallel(world_size=2, strategy="ddp")    # or strategy="fsdp"
    print(res); print(res.summary())

Every rank starts from the same MLP (``dp.make_mlp``: fc1, GeLU, fc2) and takes ``steps`` Adam
steps on its rows ``[b/p, h]`` of each batch (mean-squared error), once with the course's strategy
(``dp.build_strategy``: ``"ddp"`` or ``"zero3"``) and once with PyTorch's:

    course DDP    -> torch.nn.parallel.DistributedDataParallel(model) + torch.optim.Adam
    course ZeRO-3 -> fully_shard(fc1), fully_shard(fc2), fully_shard(model) + torch.optim.Adam
                     (FSDP2: each parameter a DTensor ``Shard(0)`` on a 1-D DeviceMesh)

More than one step, because an optimizer's state carries over (and a gradient never cleared would
show only from the second step). Compared on every rank after the last step: the full parameters
and the averaged gradient of that step (FSDP2's sharded ones through ``.full_tensor()``, the
course's ZeRO-3 shards all-gathered outside the record), and the loss of the rank's rows. The
collectives of the last step are counted per direction: DDP's bucket all-reduce runs inside
backward (autograd hooks); the course's runs right after it. ``bug=`` (``no-ddp-wrapper``,
``fsdp-sum-not-average`` in dp/bugs.py) sets PyTorch up wrongly; the result must then disagree.
"""
from __future__ import annotations

import copy
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from mtb_helpers.checking.agreement import (Agreement, agreement, course_counts, one_dim_mesh,
                                            torch_counts)
from mtb_helpers.checking.bug import Bug, resolve, swap
from mtb_helpers.checking.tolerances import divisible, positive_sizes
from mtb_helpers.comm.records import record
from mtb_helpers.dp.fsdp import build_strategy
from mtb_helpers.dp.strategies import Adam, flat, make_mlp, rank_rows
from mtb_helpers.runtime.ranks import resolve_world_size, run

__all__ = ["pytorch_data_parallel", "dp_on_rank", "torch_model", "fully_shard_linears", "DP_PAIRS"]

DP_PAIRS = {"ddp": "ddp", "fsdp": "zero3"}     # PyTorch's strategy -> the course's
_DIRECTIONS = ("forward", "backward", "step")
_MAP = {"ddp": [("OverlappedDDP: all-reduce of the grad bucket", "DistributedDataParallel(model)"),
                ("OverlappedDDP.average: / p", "DDP divides the bucket by p")],
        "fsdp": [("FSDP: one unit per nn.Linear", "fully_shard(layer) per nn.Linear"),
                 ("flat unit padded to p, shard r", "each parameter a DTensor Shard(0)"),
                 ("all-gather before use, fwd and bwd", "unshard / reshard_after_forward"),
                 ("reduce-scatter of [dW, db], / p", "reduce-scatter, gradient divide factor p")]}


def torch_model(strategy: str, model: nn.Sequential) -> nn.Module:
    """A copy of ``model`` in PyTorch's data parallelism: ``DistributedDataParallel`` ("ddp"), or
    FSDP2 ``fully_shard`` on each ``nn.Linear`` and then on the whole model ("fsdp")."""
    from torch.nn.parallel import DistributedDataParallel
    model = copy.deepcopy(model)
    return DistributedDataParallel(model) if strategy == "ddp" else fully_shard_linears(model)


def fully_shard_linears(model: nn.Sequential, **kwargs) -> nn.Module:
    """FSDP2 in place: ``fully_shard`` on each ``nn.Linear`` of ``model``, then on the whole model,
    over a 1-D mesh of every rank (``kwargs``, e.g. ``mp_policy``, to each call)."""
    from torch.distributed.fsdp import fully_shard
    mesh = one_dim_mesh()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, **kwargs)
    return fully_shard(model, mesh=mesh, **kwargs)


def _course_full(course, grads: bool) -> torch.Tensor:
    """The course strategy's full flat ``[Ψ]`` parameters (or averaged grads), ZeRO-3's shards
    all-gathered unit by unit (outside any record: this is only for the comparison)."""
    if course.name != "zero3":
        return course.pieces()["grads" if grads else "params"][:course.layout.numel].clone()
    return torch.cat([v.reshape(-1) for v in course.fsdp.gather_full_params(grads).values()])


def dp_on_rank(strategy: str, model: nn.Sequential, batches: list, adam: Adam,
               bug: Bug | None = None) -> dict:
    """Run on every rank: ``len(batches)`` Adam steps on this rank's rows, the course's strategy
    and PyTorch's; returns the full params and last grads each holds, and the last step's counts."""
    import torch.distributed as dist
    from torch.distributed.tensor.debug import CommDebugMode
    t, r = dist.get_world_size(), dist.get_rank()
    rows = rank_rows(batches, t, r)
    params = list(model.parameters())
    start = {"params": flat(params), "exp_avg": torch.zeros(sum(p.numel() for p in params),
                                                             dtype=params[0].dtype),
             "step": 0}
    start["exp_avg_sq"] = start["exp_avg"].clone()
    course = build_strategy(DP_PAIRS[strategy], model, start, adam)
    for x, y in rows:
        with record() as rec:                   # train_step clears last step's grads first
            course_loss = course.train_step(x, y)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = swap(bug, torch_model)(strategy, model)
        opt = adam.torch_optimizer(theirs.parameters())
        for x, y in rows:
            opt.zero_grad(set_to_none=True)
            with CommDebugMode() as fwd:
                loss = F.mse_loss(theirs(x), y)
            with CommDebugMode() as bwd:
                loss.backward()
            with CommDebugMode() as step:
                opt.step()
        got = {"params": flat(theirs.parameters()),
               "grads": flat(p.grad for p in theirs.parameters()),
               "loss": loss.detach().reshape(1)}
    ours = {"params": _course_full(course, grads=False), "grads": _course_full(course, grads=True),
            "loss": course_loss.reshape(1)}
    mode = {"forward": fwd, "backward": bwd, "step": step}
    counts = {d: (torch_counts(mode[d]), course_counts(rec, d)) for d in _DIRECTIONS}
    return {"torch": got, "course": ours, "counts": counts}


def pytorch_data_parallel(world_size: int = 2, strategy: str = "ddp", steps: int = 3,
                          batch: int = 6, hidden: int = 4, ffn_hidden: int = 6, seed: int = 0,
                          lr: float = 1e-2, bug: str | None = None,
                          timeout: float = 60.0) -> Agreement:
    """``strategy="ddp"``: DistributedDataParallel vs the course's ``OverlappedDDP``; ``"fsdp"``: FSDP2
    ``fully_shard`` vs the course's ZeRO-3 (``FSDP``). ``steps`` Adam steps on ``batch`` rows each."""
    t = resolve_world_size(world_size)
    if strategy not in DP_PAIRS:
        raise ValueError(f"unknown strategy {strategy!r}; expected one of {sorted(DP_PAIRS)}")
    wrong = resolve(bug, "pytorch_data_parallel", strategy=strategy)
    positive_sizes(steps=steps, batch=batch, hidden=hidden, ffn_hidden=ffn_hidden)
    divisible("batch", batch, f"the world size {t}", t, "data parallelism gives every rank batch/p rows")
    gen = torch.Generator().manual_seed(seed)
    model = make_mlp(hidden, ffn_hidden, gen, torch.float64)
    batches = [tuple(torch.randn(batch, hidden, generator=gen, dtype=torch.float64)
                     for _ in range(2)) for _ in range(steps)]
    results = run(dp_on_rank, strategy, model, batches, Adam(lr=lr), wrong, world_size=t,
                  timeout=timeout)
    name = {"ddp": "DistributedDataParallel", "fsdp": "FSDP2 fully_shard"}[strategy]
    return agreement(f"{name}, {steps} Adam steps", results, _MAP[strategy], bug,
                     ("counts are those of the last step",))
