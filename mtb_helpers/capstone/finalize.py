"""Sequence parallelism's replicated-parameter grads, all-reduced once per step.

Under SP every LayerNorm's weight and bias ``[h]`` and Wo's and fc2's biases are whole on every
tensor rank, but each rank feeds them only its sequence rows: their grads are partial. Notebook
04's layers all-reduce each one inside backward, per parameter and micro-batch (6 per block, ~1 ms
each on a shared CPU). The capstone does as Megatron-LM's ``finalize_model_grads``: the layers
built with ``grad_sync="step"`` (``sp/layers.py``) leave them partial, the micro-batches
accumulate, and after the last backward ONE all-reduce over the tensor group sums them all:

    grads of the rep parameters -> cat -> [Ψ_rep] = [(6 L_p + 2 (last stage)) h] -> all-reduce -> split

Summing the micro-batches first and then the ranks is the same sum in another order.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from mtb_helpers.comm.mesh import group_size
from mtb_helpers.comm.records import note
from mtb_helpers.comm.regions import GRAD_ALLREDUCE_SP

__all__ = ["SequenceParallelGrads", "FINALIZE"]

FINALIZE = "finalize"   # the operator of the one all-reduce in the record


class SequenceParallelGrads:
    """The stage's replicated parameters (``layers.replicated_params``) and the one all-reduce
    that completes their grads; call ``finalize()`` after the step's last backward, before the
    data-parallel reduction."""

    def __init__(self, params: list[torch.Tensor], group):
        self.params, self.group = list(params), group

    def finalize(self) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])   # [Ψ_rep], partial over sequence rows
        total, tp = flat.clone(), group_size(self.group)
        if tp > 1:   # one tensor rank: its grads are already whole (still recorded, 0 B sent)
            dist.all_reduce(total, group=self.group)   # -> [Ψ_rep], summed over tp
        note("all_reduce", flat, total, GRAD_ALLREDUCE_SP, FINALIZE, "backward", tp)
        for p, part in zip(self.params, total.split([p.numel() for p in self.params])):
            p.grad = part.view_as(p).clone() if p.grad is None else p.grad.copy_(part.view_as(p))
