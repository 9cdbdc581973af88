"""Notebook 04 in PyTorch's own API: ``SequenceParallel`` against ``SequenceParallelMLPBlock``.

    res = pytorch_sequence_parallel(world_size=2)
    print(res); print(res.summary())

On every rank the same full LayerNorm, fc1 and fc2 build ``y = x + fc2(gelu(fc1(LN(x))))`` twice,
on this rank's sequence rows ``x_r [s/t, b, h]`` (Megatron's sequence-first layout, so PyTorch
gets ``sequence_dim=0``): once as the course's block, once as a plain module parallelised with

    {"ln": SequenceParallel(sequence_dim=0),                 # LayerNorm on Shard(0) rows
     "fc1": ColwiseParallel(input_layouts=Shard(0)),         # Shard(0) -> Replicate: all-gather
     "fc2": RowwiseParallel(output_layouts=Shard(0))}        # Partial -> Shard(0): reduce-scatter

Dropout is off (p = 0): PyTorch's dropout draws from each rank's own generator and the course keys
its mask by global position; the course's check covers dropout. One difference is real and shown:
the course all-reduces the LayerNorm grads inside backward (``allreduce_sequence_parallel_grad``);
PyTorch leaves them ``Partial`` (each rank holds the sum over its own rows) and reduces them only
when someone asks for the value: ``.full_tensor()`` here, or an optimizer step on the DTensor.
Those all-reduces are counted in a third row, ``grads .full_tensor()``.
"""
from __future__ import annotations

import copy
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from mtb_helpers.checking.agreement import (Agreement, agreement, course_counts, full_grad, local,
                                            one_dim_mesh, torch_counts)
from mtb_helpers.checking.bug import Bug, resolve, swap
from mtb_helpers.tp.pytorch import course_run, torch_run
from mtb_helpers.comm.sharding import local_piece
from mtb_helpers.runtime.ranks import resolve_world_size, run
from mtb_helpers.sp.layers import SequenceParallelMLPBlock
from mtb_helpers.sp.memory import check_block_sizes, make_block_inputs

__all__ = ["pytorch_sequence_parallel", "sp_on_rank", "PlainBlock"]

_PARAMS = ("ln.weight", "ln.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
_MAP = [("SequenceParallelLayerNorm on [s/t, b, h]", "SequenceParallel(sequence_dim=0)"),
        ("gather_from_sequence_parallel_region", "fc1 input_layouts=Shard(0) -> Replicate"),
        ("reduce_scatter_to_sequence_parallel_region", "fc2 output_layouts=Shard(0)"),
        ("LayerNorm grads all-reduced in backward", "LayerNorm grads left Partial()")]


class PlainBlock(nn.Module):
    """``y = x + fc2(gelu(fc1(ln(x))))``, ``x, y: [s, b, h]``: the module PyTorch parallelises."""

    def __init__(self, ln: nn.LayerNorm, fc1: nn.Linear, fc2: nn.Linear):
        super().__init__()
        self.ln, self.fc1, self.fc2 = ln, fc1, fc2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


def sp_on_rank(ln: nn.LayerNorm, fc1: nn.Linear, fc2: nn.Linear, x: torch.Tensor,
               dy: torch.Tensor, bug: Bug | None = None) -> dict:
    """Run on every rank: this rank's rows ``[s/t, b, h]`` of the full ``x`` and ``dy`` through the
    course's block and through ``parallelize_module``; the pieces each holds and the counts."""
    import torch.distributed as dist
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    t, r = dist.get_world_size(), dist.get_rank()
    x_r, dy_r = (local_piece(z, Shard(0), r, t) for z in (x, dy))   # [s/t, b, h]

    ours = SequenceParallelMLPBlock.from_full(ln, fc1, fc2, dropout_p=0.0)
    y, dx, rec = course_run(ours, x_r, dy_r)
    course = {"output": y, "input_grad": dx,
              **{f"{n}_grad": local(p.grad) for n, p in ours.named_parameters()
                 if n in _PARAMS}}

    theirs = PlainBlock(*(copy.deepcopy(m) for m in (ln, fc1, fc2)))
    plan = {"ln": SequenceParallel(sequence_dim=0),
            "fc1": ColwiseParallel(input_layouts=Shard(0)),
            "fc2": RowwiseParallel(output_layouts=Shard(0))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallelize_module(theirs, one_dim_mesh(), plan)
        # [s/t, b, h]: x_r + the Shard(0) local output
        yt, dxt, theirs_counts = torch_run(theirs, x_r, dy_r)
        grads = dict(theirs.named_parameters())
        placements = {n: str(grads[n].grad.placements) for n in ("ln.weight", "fc2.bias")}
        with CommDebugMode() as sync:
            read = swap(bug, full_grad)
            got = {f"{n}_grad": read(n, grads[n].grad) for n in _PARAMS}
    pytorch = {"output": yt, "input_grad": dxt, **got}
    counts = {**{d: (theirs_counts[d], course_counts(rec, d)) for d in ("forward", "backward")},
              "grads .full_tensor()": (torch_counts(sync), {})}
    return {"torch": pytorch, "course": {q: course[q] for q in pytorch}, "counts": counts,
            "placements": placements}


def pytorch_sequence_parallel(world_size: int = 2, seq_len: int = 12, batch: int = 2,
                              hidden: int = 8, ffn_hidden: int = 12, seed: int = 0,
                              bug: str | None = None, timeout: float = 60.0) -> Agreement:
    """``SequenceParallel`` + Colwise/Rowwise with ``Shard(0)`` vs ``SequenceParallelMLPBlock``:
    output and input grad ``[s/t, b, h]``, every parameter grad (LayerNorm's as the full sum)."""
    t = resolve_world_size(world_size)
    wrong = resolve(bug, "pytorch_sequence_parallel")
    check_block_sizes(seq_len, ffn_hidden, t)
    ln, fc1, fc2, x, dy = make_block_inputs(seq_len, batch, hidden, ffn_hidden, torch.float64,
                                            seed)
    results = run(sp_on_rank, ln, fc1, fc2, x, dy, wrong, world_size=t, timeout=timeout)
    place = results[0]["placements"]
    notes = (f"after backward PyTorch's ln.weight.grad is {place['ln.weight']}, "
             f"fc2.bias.grad is {place['fc2.bias']}",)
    return agreement("sequence parallel", results, _MAP, bug, notes)
