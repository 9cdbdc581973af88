"""An ordinary training script that uses the course's wrappers without the course's ``run()``.

    python tests/scripts/overlap_train.py [MODE[,MODE...]] [world_size]   # MODE: ddp, zero1,
    torchrun --standalone --nproc-per-node=2 tests/scripts/overlap_train.py ddp  # fsdp, fsdp-bf16, raise

Started by itself it makes its ranks with ``torch.multiprocessing.spawn`` and
``init_process_group("gloo")`` (a FileStore in a temporary directory); under torchrun it is one
rank. The model has tied weights (``b.weight is a.weight``), a frozen layer and a layer used on
even steps only. Every rank trains on its rows of each batch; rank 0 compares the parameters after
4 AdamW steps with one process on the whole batch, prints ``OK <mode> max error ...`` and the
script exits 0, or prints ``MISMATCH`` and exits 1. ``raise``: rank 1 raises in the middle of a
backward, after its first bucket has started reducing.
"""
from __future__ import annotations

import os
import sys
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from mtb_helpers.dp import FSDP, OverlappedDDP, ShardedOptimizer
from mtb_helpers.dp.adam import AdamUpdate

STEPS, BATCH, H = 4, 12, 6


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.frozen, self.extra, self.b = (nn.Linear(H, H) for _ in range(4))
        self.b.weight = self.a.weight                 # tied: one parameter, used twice
        self.frozen.requires_grad_(False)

    def forward(self, x: torch.Tensor, step: int, explode: bool = False) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        if explode:                                   # b's bucket has started by then
            h = Explode.apply(h)
        h = torch.tanh(self.frozen(h))
        if step % 2 == 0:                             # no gradient for ``extra`` on odd steps
            h = h + torch.tanh(self.extra(h))
        return self.b(h)


class Explode(torch.autograd.Function):
    """Identity; its backward raises on rank 1 (a bug deep inside someone's backward)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        if dist.get_rank() == 1:
            raise RuntimeError("rank 1 fails in the middle of its backward")
        return g


def data():
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, H, generator=gen, dtype=torch.float64),
             torch.randn(BATCH, H, generator=gen, dtype=torch.float64)) for _ in range(STEPS)]


def reference() -> dict[str, torch.Tensor]:
    model = Net().double()
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    for step, (x, y) in enumerate(data()):
        opt.zero_grad()
        F.mse_loss(model(x, step), y).backward()
        opt.step()
    return {n: p.detach() for n, p in model.named_parameters()}


def main(rank: int, world: int, modes: str, store: str | None) -> None:
    if store is not None:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    for mode in modes.split(","):
        try:
            err, tol = train(rank, world, mode)
        except Exception:
            # say it here: when a peer's gloo aborts on the closed connection first, spawn reports
            # that peer's signal and never prints this rank's exception
            print(f"rank {rank} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            raise
        if rank == 0:
            print(f"{'OK' if err <= tol else 'MISMATCH'} {mode} world {world} max error {err:.1e} "
                  f"(tol {tol})", flush=True)
            if not err <= tol:
                sys.exit(1)
        dist.barrier()


def train(rank: int, world: int, mode: str) -> tuple[float, float]:
    """``mode``'s 4 steps on this rank; the largest error against one process and its tolerance."""
    model = Net().double()
    if mode.startswith("fsdp"):
        low = mode == "fsdp-bf16"
        wrapped = FSDP(model, compute_dtype=torch.bfloat16 if low else None,
                       reduce_dtype=torch.float32 if low else None)
        opt = torch.optim.AdamW(wrapped.parameters(), lr=0.05)
    else:
        wrapped = OverlappedDDP(model, bucket_cap_mb=0.0001, find_unused_parameters=True,
                                overlap=mode != "ddp-after")   # notebook 06's DDP: after backward
        params = wrapped.parameters()
        if mode == "zero1-course-adam":   # notebook 06's ZeRO-1: the written-out AdamW inside
            opt = ShardedOptimizer(params, AdamUpdate, lr=0.05, betas=(0.9, 0.999), eps=1e-8,
                                   weight_decay=0.01, decoupled=True)
        else:
            opt = (ShardedOptimizer(params, torch.optim.AdamW, lr=0.05) if mode == "zero1"
                   else torch.optim.AdamW(params, lr=0.05))
    n = BATCH // world
    for step, (x, y) in enumerate(data()):
        opt.zero_grad()
        out = wrapped(x[rank * n:(rank + 1) * n], step, explode=mode == "raise")
        F.mse_loss(out.double(), y[rank * n:(rank + 1) * n]).backward()
        wrapped.finish_gradient_synchronization()
        opt.step()
    got = (wrapped.gather_full_params() if mode.startswith("fsdp")
           else {k: p.detach() for k, p in model.named_parameters()})
    ref = reference()
    err = max((got[k] - ref[k]).abs().max().item() for k in ref) if set(got) == set(ref) else 1e9
    return err, (2e-2 if mode == "fsdp-bf16" else 1e-12)


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "ddp"
    if "RANK" in os.environ:                          # torchrun made this process one rank
        dist.init_process_group("gloo")
        main(dist.get_rank(), dist.get_world_size(), mode, None)
        dist.destroy_process_group()
    else:
        world = int(sys.argv[2]) if len(sys.argv) > 2 else 2
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(main, args=(world, mode, os.path.join(tmp, "store")), nprocs=world)
