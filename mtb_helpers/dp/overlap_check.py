"""``check_overlap``: the hiding-communication wrappers on real ranks against one process.

    report = check_overlap(world_size=2, wrapper="ddp")    # or "zero1", "fsdp"
    report.passed, report.rows, report.extra["timeline"]

The model is ``overlap_model`` (three ``nn.Linear``), every rank trains on its rows of each batch
for ``steps`` AdamW steps; the reference is one process on the whole batch, in float64. Rows per
rank and step (``note`` says ``"step k"``):

* ``ddp``: ``OverlappedDDP`` + AdamW. Each step is two micro-batches, the first inside ``no_sync``
  (gradient accumulation): ``params``, ``grads`` (the averaged gradient the optimizer used) and
  ``no_sync all-reduces`` (how many collectives the ``no_sync`` backward issued: 0). Rank 0 starts
  each synchronised backward ``straggle`` seconds late, as a slow rank would, so a rank that reads
  its buckets without waiting for them reads them unreduced.
* ``zero1``: ``OverlappedDDP`` + ``ShardedOptimizer(AdamW)``: ``params``; ``extra["state_bytes"]``
  per rank next to the unsharded optimizer's.
* ``fsdp``: ``FSDP`` + AdamW on its shards: ``params`` and ``grads`` (gathered full, outside the
  record), ``all-gathers`` per step (2 per unit: before its forward and its backward) and
  ``on-demand all-gathers`` (gathers nobody prefetched: 2 with ``prefetch``, the first unit's
  forward and the last unit's backward; 2 per unit without). With ``compute_dtype=float16`` every
  rank gets the same rows and the loss is scaled so that each rank's largest gradient is 0.6 of
  float16's largest value: the sum over ranks overflows float16, and ``reduce_dtype=float32`` must
  keep it finite. Under a 16-bit compute dtype the tolerance is 5 % of the largest reference value
  (the rounding of 8 or 11 bits, through AdamW); counts are compared exactly.
"""
from __future__ import annotations

import copy
import math
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mtb_helpers.checking.bug import resolve, swap
from mtb_helpers.checking.report import Report, Row, compare, exact
from mtb_helpers.checking.tolerances import as_dtype, check_config, divisible, number, positive_sizes
from mtb_helpers.comm.records import record
from mtb_helpers.dp.buckets import bucket_cap_bytes
from mtb_helpers.dp.fsdp_wrapper import FSDP, check_dtype
from mtb_helpers.dp.overlap import OverlappedDDP
from mtb_helpers.dp.overlap_pytorch import overlap_model
from mtb_helpers.dp.sharded_optimizer import ShardedOptimizer
from mtb_helpers.dp.strategies import flat
from mtb_helpers.runtime.ranks import resolve_world_size, run

__all__ = ["check_overlap", "WRAPPERS"]

WRAPPERS = ("ddp", "zero1", "fsdp")
LR = 0.01
LOW_PRECISION = (torch.float16, torch.bfloat16)


def _on_rank(wrapper, model, batches, bug, cap, compute_dtype, reduce_dtype, prefetch, scale,
             straggle) -> dict:
    t, r = dist.get_world_size(), dist.get_rank()
    model = copy.deepcopy(model)
    same_rows = compute_dtype == torch.float16
    out = {"params": [], "grads": [], "counts": []}
    if wrapper == "fsdp":
        net = swap(bug, FSDP)(model, compute_dtype=compute_dtype, reduce_dtype=reduce_dtype,
                              prefetch=prefetch)
        opt = torch.optim.AdamW(net.parameters(), lr=LR)
    else:
        net = swap(bug, OverlappedDDP)(model, bucket_cap_mb=cap)
        opt = (swap(bug, ShardedOptimizer)(net.parameters(), torch.optim.AdamW, lr=LR)
               if wrapper == "zero1" else torch.optim.AdamW(net.parameters(), lr=LR))
    for micro in batches:
        opt.zero_grad(set_to_none=True)
        counts = {}
        for i, (x, y) in enumerate(micro):
            n = len(x) // t   # float16: every rank the first rows (see the module docstring)
            x, y = (x[:n], y[:n]) if same_rows else (x[r * n:(r + 1) * n], y[r * n:(r + 1) * n])
            last = i == len(micro) - 1
            with record() as rec:
                if not last:
                    with net.no_sync():
                        (F.mse_loss(net(x).to(y.dtype), y) * scale).backward()
                        net.finish_gradient_synchronization()
                    counts["no_sync all-reduces"] = rec.count("all_reduce")
                    continue
                loss = F.mse_loss(net(x).to(y.dtype), y) * scale
                if r == 0 and straggle:
                    time.sleep(straggle)                 # a slow rank: the others wait for it
                loss.backward()
                net.finish_gradient_synchronization()
            if wrapper == "fsdp":
                counts["all-gathers"] = rec.count("all_gather")
                counts["on-demand all-gathers"] = sum("(on demand)" in e.name for e in net.timeline)
        grads = flat(net.gather_full_params(grads=True).values() if wrapper == "fsdp"
                     else (p.grad for p in net.module.parameters()))
        opt.step()
        out["params"].append(flat(net.gather_full_params().values() if wrapper == "fsdp"
                                  else net.module.parameters()))
        out["grads"].append(grads)
        out["counts"].append(counts)
    out["timeline"] = [e.__dict__ for e in net.timeline]
    out["buckets"] = getattr(net, "buckets", None)
    if wrapper == "zero1":
        plain = torch.optim.AdamW(copy.deepcopy(net.module).parameters(), lr=LR)
        for p in (q for g in plain.param_groups for q in g["params"]):
            p.grad = torch.zeros_like(p)
        plain.step()                                   # the unsharded optimizer's state, measured
        out["state_bytes"] = {"sharded": opt.local_state_bytes(),
                              "unsharded": sum(v.numel() * v.element_size() for s in plain.state.values()
                                               for v in s.values() if torch.is_tensor(v))}
    return out


def _reference(model, batches, scale, same_rows, t):
    model = copy.deepcopy(model).double()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    params, grads = [], []
    for micro in batches:
        opt.zero_grad()
        for x, y in micro:
            x, y = (x[:len(x) // t], y[:len(y) // t]) if same_rows else (x, y)
            (F.mse_loss(model(x.double()), y.double()) * scale).backward()
        grads.append(flat(p.grad for p in model.parameters()))
        opt.step()
        params.append(flat(model.parameters()))
    return params, grads


def _scale(model, batches, t) -> float:
    """The loss scale that makes one rank's largest gradient 0.6 of float16's largest value."""
    m = copy.deepcopy(model).double()
    x, y = batches[0][-1]
    F.mse_loss(m(x[:len(x) // t].double()), y[:len(y) // t].double()).backward()
    return 0.6 * torch.finfo(torch.float16).max / max(float(p.grad.abs().max()) for p in m.parameters())


def _validate(wrapper, t, steps, batch, hidden, cap, compute_dtype, reduce_dtype, bug, straggle):
    if wrapper not in WRAPPERS:
        raise ValueError(f"unknown wrapper {wrapper!r}; expected one of {WRAPPERS}")
    positive_sizes(steps=steps, batch=batch, hidden=hidden)
    divisible("batch", batch, f"the world size {t}", t, "data parallelism gives every rank batch/p rows")
    bucket_cap_bytes(cap)
    check_dtype("compute_dtype", compute_dtype)
    check_dtype("reduce_dtype", reduce_dtype)
    if wrapper != "fsdp" and (compute_dtype, reduce_dtype) != (None, None):
        raise ValueError("compute_dtype / reduce_dtype are FSDP's: use wrapper='fsdp'")
    number("straggle", straggle, lambda s: 0 <= s <= 5, "between 0 and 5 seconds")
    # what a bug needs (its wrapper; float16 for the overflow) is declared on the Bug itself
    return resolve(bug, "overlap", wrapper=wrapper, compute_dtype=compute_dtype)


def check_overlap(world_size: int = 2, wrapper: str = "ddp", steps: int = 3, batch: int = 12,
                  hidden: int = 8, bucket_cap_mb: float = 0.0003, compute_dtype=None,
                  reduce_dtype=None, prefetch: bool = True, dtype=torch.float64, seed: int = 0,
                  bug: str | None = None, straggle: float = 0.2, timeout: float = 60.0) -> Report:
    """``steps`` steps of ``wrapper`` on ``world_size`` ranks against one process; see the module
    docstring. ``bucket_cap_mb`` (ddp, zero1): the default makes 3 buckets of 2 parameters."""
    dtype, t = as_dtype(dtype), resolve_world_size(world_size)
    wrong = _validate(wrapper, t, steps, batch, hidden, bucket_cap_mb, compute_dtype, reduce_dtype,
                      bug, straggle)
    model = overlap_model(hidden, dtype if compute_dtype is None else torch.float32, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    micro = 2 if wrapper == "ddp" else 1
    batches = [[tuple(torch.randn(batch, hidden, generator=gen, dtype=model[0].weight.dtype)
                      for _ in range(2)) for _ in range(micro)] for _ in range(steps)]
    same_rows = compute_dtype == torch.float16
    scale = _scale(model, batches, t) if same_rows else 1.0
    results = run(_on_rank, wrapper, model, batches, wrong, bucket_cap_mb,
                  compute_dtype, reduce_dtype, prefetch, scale,
                  straggle if wrapper == "ddp" else 0.0, world_size=t, timeout=timeout)
    ref_p, ref_g = _reference(model, batches, scale, same_rows, t)
    low = compute_dtype in LOW_PRECISION
    model_dtype = model[0].weight.dtype
    rows = []
    quantities = ("params",) if wrapper == "zero1" else ("params", "grads")
    units = sum(1 for m in model if isinstance(m, torch.nn.Linear))
    want = {"no_sync all-reduces": 0, "all-gathers": 2 * units,
            "on-demand all-gathers": 2 if prefetch else 2 * units}
    for k in range(steps):
        for q in quantities:
            ref = (ref_p if q == "params" else ref_g)[k]
            for r, res in enumerate(results):
                got = res[q][k]
                if low:
                    err = float((got.double() - ref).abs().max())
                    tol = 0.05 * float(ref.abs().max())
                    row = Row(q, r, err, err / float(ref.abs().max()), math.nan, tol,
                              err <= tol, err, math.nan, f"step {k + 1}; {compute_dtype} compute")
                else:
                    row = compare(q, r, got, ref.to(model_dtype), ref, model_dtype,
                                  note=f"step {k + 1}")
                rows.append(row)
        for r, res in enumerate(results):
            for name, got in res["counts"][k].items():
                rows.append(exact(name, r, got, want[name], f"step {k + 1}; {got} (expected {want[name]})"))
    extra = {"timeline": [res["timeline"] for res in results],
             "buckets": results[0]["buckets"]}
    if wrapper == "zero1":
        extra["state_bytes"] = {"per_rank": [res["state_bytes"]["sharded"] for res in results],
                                "unsharded": results[0]["state_bytes"]["unsharded"]}
    config = check_config(t, dtype, seed, bug, wrapper=wrapper, steps=steps, batch=batch,
                          hidden=hidden, bucket_cap_mb=bucket_cap_mb, prefetch=prefetch,
                          compute_dtype=str(compute_dtype), reduce_dtype=str(reduce_dtype))
    return Report("overlap", config, rows, [], [], extra=extra)
