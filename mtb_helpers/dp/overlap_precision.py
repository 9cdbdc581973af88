"""Mixed precision under ``FSDP``: what is cast where, the bytes it saves, the error it leaves.

    res = mixed_precision(world_size=2, compute_dtypes=(torch.bfloat16, torch.float16))
    res["errors"]["bfloat16"]     # per parameter: max |param - the fp32 run's param| after the steps
    res["bytes"]["bfloat16"]      # {"all_gather": B, "reduce_scatter": B} one rank sent in a step

The same model (``overlap_model``) and batches train ``steps`` AdamW steps under FSDP once in
float32 and once per compute dtype (``reduce_dtype=float32``): the shards (master weights) and
AdamW stay float32; each shard is cast to the compute dtype before its all-gather (half the bytes
for a 16-bit dtype), forward and backward run in it, and the gradient is cast back to float32
before the reduce-scatter. Bytes are those the collectives' record counts (all-gather: what the
rank sends, (p-1) x its shard; reduce-scatter: (p-1)/p of the full gradient), for the last step.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mtb_helpers.checking.tolerances import divisible
from mtb_helpers.comm.records import record
from mtb_helpers.dp.fsdp_wrapper import FSDP
from mtb_helpers.dp.overlap_pytorch import overlap_model
from mtb_helpers.dp.strategies import rank_rows
from mtb_helpers.runtime.ranks import resolve_world_size, run

__all__ = ["mixed_precision"]


def _on_rank(model, batches, dtypes) -> dict:
    t, r = dist.get_world_size(), dist.get_rank()
    out = {}
    for d in (None, *dtypes):
        fsdp = FSDP(copy.deepcopy(model), compute_dtype=d, reduce_dtype=torch.float32 if d else None)
        opt = torch.optim.AdamW(fsdp.parameters(), lr=0.01)
        for x, y in rank_rows(batches, t, r):
            opt.zero_grad()
            with record() as rec:
                F.mse_loss(fsdp(x).float(), y).backward()
                fsdp.finish_gradient_synchronization()
            opt.step()
        sent = {op: sum(e.sent_bytes for e in rec.events if e.op == op)
                for op in ("all_gather", "reduce_scatter")}
        out[str(d or torch.float32).replace("torch.", "")] = {"params": fsdp.gather_full_params(),
                                                             "bytes": sent}
    return out


def mixed_precision(world_size: int = 2, compute_dtypes=(torch.bfloat16, torch.float16),
                    steps: int = 3, batch: int = 12, hidden: int = 8, seed: int = 0,
                    timeout: float = 120.0) -> dict:
    """See the module docstring. Returns ``{"names", "errors": {dtype: [per parameter]},
    "bytes": {dtype: {"all_gather", "reduce_scatter"}}}`` (rank 0's bytes; every rank sends the same)."""
    t = resolve_world_size(world_size)
    for d in compute_dtypes:
        if not isinstance(d, torch.dtype) or not d.is_floating_point:
            raise ValueError(f"compute_dtypes must be floating-point torch dtypes, got {d!r}")
    divisible("batch", batch, f"the world size {t}", t, "data parallelism gives every rank batch/p rows")
    model = overlap_model(hidden, torch.float32, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    batches = [tuple(torch.randn(batch, hidden, generator=gen) for _ in range(2)) for _ in range(steps)]
    res = run(_on_rank, model, batches, tuple(compute_dtypes), world_size=t, timeout=timeout)[0]
    base = res["float32"]["params"]
    names = list(base)
    errors = {d: [float((v["params"][n] - base[n]).abs().max()) for n in names]
              for d, v in res.items() if d != "float32"}
    return {"names": names, "errors": errors, "bytes": {d: v["bytes"] for d, v in res.items()}}
