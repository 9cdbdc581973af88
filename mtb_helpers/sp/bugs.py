"""Deliberately wrong sequence-parallel parts, for ``check_sequence_parallel(bug=...)``.

Like ``tp/bugs.py``: each bug is a subclass of a correct part from ``sp/layers.py`` whose ``forward``
differs by the one bug (marked ``# BUG``). The last one reads PyTorch's result wrongly in the
comparison of ``sp/pytorch.py``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mtb_helpers.checking.bug import Bug, names_for, register, swap
from mtb_helpers.comm.mesh import group_rank, group_size
from mtb_helpers.comm.regions import (allreduce_sequence_parallel_grad,
                                      reduce_from_tensor_model_parallel_region)
from mtb_helpers.sp.layers import (PositionKeyedDropout, SequenceParallelColumnLinear,
                                   SequenceParallelLayerNorm, SequenceParallelMLPBlock,
                                   SequenceParallelRowLinear)
from mtb_helpers.checking.agreement import full_grad, local


class LayerNormWithoutGradAllReduce(SequenceParallelLayerNorm):
    """sp-no-layernorm-grad-allreduce."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # BUG: weight and bias are used directly, so each rank keeps the grad of its own tokens only
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class SameMaskDropout(PositionKeyedDropout):
    """sp-same-dropout-mask."""

    def row_offset(self, x: torch.Tensor) -> int:
        return 0   # BUG: positions keyed locally, so every shard draws the mask of rows 0..s/t


class RowAllReduceThenSlice(SequenceParallelRowLinear):
    """sp-allreduce-instead-of-reduce-scatter."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # BUG: g all-reduces the whole [s, b, h] and the rank slices its rows out. The forward
        # values are right, but the transpose of "slice" pads with zeros and g's backward is the
        # identity: no all-gather of dY_fc2, so every grad before this point misses the other shards.
        full = reduce_from_tensor_model_parallel_region(F.linear(x, self.weight), self.group)
        rows = full.shape[0] // group_size(self.group)
        r = group_rank(self.group)
        y = full[r * rows:(r + 1) * rows]
        return y + allreduce_sequence_parallel_grad(self.bias, "fc2.bias", self.group)


def layernorm_grad_local(name: str, grad) -> torch.Tensor | None:
    """ln-grad-partial."""
    if name.startswith("ln."):
        return local(grad)   # BUG: the Partial piece, the sum over this rank's own rows only
    return full_grad(name, grad)


BUGS: dict[str, Bug] = {
    "sp-no-layernorm-grad-allreduce": Bug(
        'sequence-parallel LayerNorm: weight and bias grads are not '
        'all-reduced, so each rank keeps the grad of its own tokens',
        checks=('sequence',), replaces={SequenceParallelLayerNorm: LayerNormWithoutGradAllReduce}),
    "sp-same-dropout-mask": Bug(
        'sequence-parallel dropout: the mask is keyed by local positions, so '
        'every sequence shard drops the same elements',
        checks=('sequence',), replaces={PositionKeyedDropout: SameMaskDropout},
        needs={"dropout_p > 0 (no mask otherwise)": lambda a: a["dropout_p"] > 0}),
    "sp-allreduce-instead-of-reduce-scatter": Bug(
        'sequence-parallel fc2: all-reduce (g) of the whole sequence, then each '
        'rank slices its rows; forward is right, backward never all-gathers dY_fc2',
        checks=('sequence',), replaces={SequenceParallelRowLinear: RowAllReduceThenSlice}),
    "ln-grad-partial": Bug(
        "PyTorch's LayerNorm grads read with .to_local(): each rank's Partial piece, the sum "
        "over its own rows only", checks=("pytorch_sequence_parallel",),
        replaces={full_grad: layernorm_grad_local}),
}
SP_BUGS = names_for(BUGS, "sequence")


def build_block(ln: nn.LayerNorm, fc1: nn.Linear, fc2: nn.Linear, dropout_p: float = 0.1,
                seed: int = 0, bug: Bug | None = None, group=None) -> SequenceParallelMLPBlock:
    """``SequenceParallelMLPBlock.from_full(...)`` with ``bug`` injected into the part it concerns."""
    norm = swap(bug, SequenceParallelLayerNorm)
    drop = swap(bug, PositionKeyedDropout)
    row = swap(bug, SequenceParallelRowLinear)
    return SequenceParallelMLPBlock(norm.from_full(ln, "ln", group),
                                    SequenceParallelColumnLinear.from_full(fc1, group=group),
                                    row.from_full(fc2, group=group),
                                    drop(dropout_p, seed, sequence_parallel=True, group=group))


register("sp", BUGS)   # at import: see checking/bug.py
