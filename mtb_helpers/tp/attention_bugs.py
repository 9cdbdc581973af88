"""Deliberately wrong pieces of tensor-parallel attention and the vocabulary split.

Each bug is a subclass of a correct piece overriding one method (marked ``# BUG``), registered
below in ``BUGS`` with the checks that accept it; ``check_tp_attention`` / ``check_vocab_parallel``
build with ``swap(bug, CorrectClass)``. The attention bugs reuse the column/row bugs of
``mtb_helpers.tp.bugs`` where the bug is the same one (a missing f, the bias before g).
"""
from __future__ import annotations

import torch

from mtb_helpers.checking.bug import Bug, register
from mtb_helpers.tp.attention import LocalAttention
from mtb_helpers.tp.bugs import ColumnWithoutF, RowBiasBeforeAllReduce
from mtb_helpers.tp.layers import ColumnParallelLinear, RowParallelLinear
from mtb_helpers.tp.vocab import VocabParallelCrossEntropy, VocabParallelEmbedding

__all__ = ["BUGS", "HeadsNotDivided", "EmbeddingWithoutMask", "MaxNotAllReduced",
           "SumExpNotAllReduced", "TargetLogitNotAllReduced"]


class HeadsNotDivided(LocalAttention):
    """attn-heads-not-divided."""

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        s, b, _ = x.shape
        # BUG: all a heads on h/t features: every head is cut into t pieces of d/t features
        return x.reshape(s, b, self.n_heads, -1).permute(1, 2, 0, 3)


class EmbeddingWithoutMask(VocabParallelEmbedding):
    """vocab-embedding-no-mask."""

    def local_ids(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        local = (ids - self.vocab_start).clamp(0, self.weight.shape[0] - 1)
        return local, torch.zeros_like(ids, dtype=torch.bool)   # BUG: nothing masked to zero


class MaxNotAllReduced(VocabParallelCrossEntropy):
    """vocab-ce-max-not-allreduced."""

    def combine_max(self, local_max: torch.Tensor) -> torch.Tensor:
        return local_max   # BUG: each rank shifts by its own max; the summed exps do not match


class SumExpNotAllReduced(VocabParallelCrossEntropy):
    """vocab-ce-sum-exp-not-allreduced."""

    def combine_sum_exp(self, local_sum: torch.Tensor) -> torch.Tensor:
        return local_sum   # BUG: the softmax denominator covers only this rank's vocab/t entries


class TargetLogitNotAllReduced(VocabParallelCrossEntropy):
    """vocab-ce-target-not-allreduced."""

    def combine_target_logit(self, picked: torch.Tensor) -> torch.Tensor:
        return picked   # BUG: ranks that do not own the target see a target logit of 0


BUGS: dict[str, Bug] = {
    "attn-heads-not-divided": Bug(
        "TP attention: each rank splits its h/t features into all a heads instead of a/t, so "
        "every head is cut into pieces of d/t features (needs head_dim divisible by t)",
        checks=("tp_attention",), replaces={LocalAttention: HeadsNotDivided},
        needs={"head_dim divisible by the world size (each head is cut into t pieces)":
               lambda a: a["head_dim"] % a["world_size"] == 0}),
    "attn-qkv-without-f": Bug(
        "TP attention: x enters the Q/K/V projection without f, so dX is never all-reduced "
        "(each rank keeps the input grad of its own heads)",
        checks=("tp_attention",), replaces={ColumnParallelLinear: ColumnWithoutF}),
    "attn-wo-bias-every-rank": Bug(
        "TP attention: every rank adds the bias of Wo before the all-reduce, so the output "
        "carries t x bo",
        checks=("tp_attention",), replaces={RowParallelLinear: RowBiasBeforeAllReduce}),
    "vocab-embedding-no-mask": Bug(
        "vocab-parallel embedding: tokens of other ranks are clamped into range but not zeroed, "
        "so every rank adds a wrong row for them",
        checks=("vocab_parallel",), replaces={VocabParallelEmbedding: EmbeddingWithoutMask}),
    "vocab-ce-max-not-allreduced": Bug(
        "vocab-parallel cross-entropy: the logit max is not all-reduced, so ranks shift by "
        "different maxima and the summed exponentials are inconsistent",
        checks=("vocab_parallel",), replaces={VocabParallelCrossEntropy: MaxNotAllReduced}),
    "vocab-ce-sum-exp-not-allreduced": Bug(
        "vocab-parallel cross-entropy: the sum of exponentials is not all-reduced, so each "
        "rank's softmax is normalised over its own vocab/t entries",
        checks=("vocab_parallel",), replaces={VocabParallelCrossEntropy: SumExpNotAllReduced}),
    "vocab-ce-target-not-allreduced": Bug(
        "vocab-parallel cross-entropy: the target logit is not all-reduced, so only the rank "
        "owning the target knows it (the loss is wrong, the gradient is not)",
        checks=("vocab_parallel",),
        replaces={VocabParallelCrossEntropy: TargetLogitNotAllReduced}),
}

register("tp", BUGS)   # at import: see checking/bug.py
