"""The vocabulary split at both ends of a Megatron model (Shoeybi et al. 2019, section 3).

Notation: ``vocab`` entries in the vocabulary, ``t`` ranks; rank ``r`` owns tokens
``[r*vocab/t, (r+1)*vocab/t)`` (``shard_range``).

* ``VocabParallelEmbedding``: rank r holds rows ``r*vocab/t:(r+1)*vocab/t`` of the table ``W_emb [vocab, h]``.
  A token outside its range looks up row 0 and is then zeroed, so exactly one rank contributes
  each token's row; ``g`` (one all-reduce) sums the ``t`` partial outputs. Backward: ``g`` is the
  identity and each rank's grad lands only in its own rows.
* ``vocab_parallel_cross_entropy``: each rank holds logits ``[.., vocab/t]``. The loss
  ``log sum_j exp(z_j - mx) - (z_target - mx)`` needs three numbers per token, each combined over
  ranks with ONE all-reduce of a ``[..]`` tensor: the max ``mx`` (all-reduce max), the sum of
  exponentials (all-reduce sum) and the target logit (all-reduce sum; only the owning rank
  contributes it). No rank ever holds ``[.., vocab]``. With ``fuse_sums=True`` the last two are ONE
  all-reduce of their stack ``[2, ..]`` (Megatron-LM's fused cross-entropy does the same): the
  same bytes, one round trip fewer; the capstone uses it, notebook 10 shows the three apart.
  The backward is written by hand and needs no communication:
  ``dx = (softmax(x) - onehot(target)) * dloss`` on this rank's columns.

Both assume ``t`` EQUAL shards (rank r's first token is ``r*vocab/t``), as Megatron does (it pads the
vocabulary to a multiple of ``t``). Uneven shards (``torch.tensor_split`` of vocab = 10 over 4 ranks:
3, 3, 2, 2) would put every later rank's tokens at the wrong ids and give a wrong loss, so they are
refused with a ValueError on every rank. The loss learns the shard widths from ``vocab_size`` when
given (no communication), else from one small all-gather of every rank's width (``agree``: an
input check, not one of the loss's three all-reduces, so neither recorded nor modelled).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mtb_helpers.comm.records import note
from mtb_helpers.comm.mesh import agree, group_rank, group_size
from mtb_helpers.comm.regions import reduce_from_tensor_model_parallel_region
from mtb_helpers.comm.sharding import Replicate, Shard, check_divisible, shard_range

__all__ = ["VocabParallelEmbedding", "VocabParallelCrossEntropy", "vocab_parallel_cross_entropy",
           "REDUCTIONS"]

REGION = "vocab_parallel_cross_entropy"
REDUCTIONS = ("mean", "sum", "none")


class VocabParallelEmbedding(nn.Module):
    """``W_emb[ids]`` with the rows of ``W_emb`` split by vocabulary range; ``.weight`` is ``[vocab/t, h]``.

    forward: token ids ``[..]`` (replicated, any shape) -> ``[.., h]`` (replicated, after g).
    """
    input_layouts = output_layouts = Replicate()   # ids [..] in, [.., h] out
    weight_layout = Shard(0)                       # [vocab/t, h]

    def __init__(self, weight: torch.Tensor, num_embeddings: int, group=None):
        super().__init__()
        self.num_embeddings, self.group = num_embeddings, group
        t, r = group_size(group), group_rank(group)
        check_divisible(f"{type(self).__name__}: num_embeddings", num_embeddings, t)
        if weight.shape[0] != num_embeddings // t:
            raise ValueError(f"weight has {weight.shape[0]} rows; num_embeddings={num_embeddings} "
                             f"on {t} ranks gives each rank {num_embeddings}/{t} = "
                             f"{num_embeddings // t} rows")
        self.vocab_start, self.vocab_end = shard_range(num_embeddings, t, r)
        self.weight = nn.Parameter(weight.detach().clone().contiguous())

    @classmethod
    def from_full(cls, embedding: nn.Embedding, group: dist.ProcessGroup | None = None
                  ) -> "VocabParallelEmbedding":
        """This rank's vocabulary rows of a full ``nn.Embedding`` (every rank passes the same)."""
        if embedding.padding_idx is not None or embedding.max_norm is not None:
            raise ValueError("VocabParallelEmbedding supports plain tables only "
                             "(padding_idx=None, max_norm=None)")
        lo, hi = shard_range(embedding.num_embeddings, group_size(group), group_rank(group))
        return cls(embedding.weight[lo:hi], embedding.num_embeddings, group)

    def local_ids(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids - start, outside)``: local row of each token (0 where another rank owns it)."""
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        return (ids - self.vocab_start).masked_fill(outside, 0), outside

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local, outside = self.local_ids(ids)
        rows = F.embedding(local, self.weight)                   # [..] -> [.., h], row 0 if not ours
        partial = rows.masked_fill(outside.unsqueeze(-1), 0.0)   # [.., h], only tokens we own
        return reduce_from_tensor_model_parallel_region(partial, self.group)   # g: -> [.., h]

    def extra_repr(self) -> str:
        return (f"tokens [{self.vocab_start}, {self.vocab_end}) of {self.num_embeddings}, "
                f"shard {tuple(self.weight.shape)}")


class _CrossEntropy(torch.autograd.Function):
    """forward: the three all-reduces (``combiner``'s methods); backward: local, by hand."""

    @staticmethod
    def forward(ctx, logits, target, combiner, reduction):
        lo = group_rank(combiner.group) * logits.shape[-1]
        local_max = logits.max(dim=-1).values                     # [.., vocab/t] -> [..]
        mx = combiner.combine_max(local_max.detach())              # all-reduce (max): [..]
        shifted = logits - mx.unsqueeze(-1)                        # [.., vocab/t]
        exp = shifted.exp()
        outside = (target < lo) | (target >= lo + logits.shape[-1])
        local_t = (target - lo).masked_fill(outside, 0)           # [..], 0 where not ours
        picked = shifted.gather(-1, local_t.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        # all-reduce (sum) of each, or of both stacked: [..], [..]
        sum_exp, target_logit = combiner.combine_sums(exp.sum(dim=-1), picked)
        loss = sum_exp.log() - target_logit                       # [..], per token
        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), local_t, outside)
        ctx.reduction = reduction
        if reduction == "mean":
            return loss.mean()
        return loss.sum() if reduction == "sum" else loss

    @staticmethod
    def backward(ctx, grad):
        softmax, local_t, outside = ctx.saved_tensors
        dlogits = softmax.clone()                                 # [.., vocab/t]
        # d loss / d x_j = softmax_j - [j == target]; the -1 only on the rank owning the target
        dlogits.scatter_add_(-1, local_t.unsqueeze(-1),
                             (outside.to(softmax.dtype) - 1.0).unsqueeze(-1))
        if ctx.reduction == "mean":
            dlogits *= grad / local_t.numel()
        elif ctx.reduction == "sum":
            dlogits *= grad
        else:
            dlogits *= grad.unsqueeze(-1)                         # [..] -> [.., 1]
        return dlogits, None, None, None


class VocabParallelCrossEntropy(nn.Module):
    """``F.cross_entropy`` on logits split by vocabulary range; see the module docstring.

    forward: ``logits [.., vocab/t]`` (sharded on the last dim), ``target [..]`` (global token ids,
    replicated) -> the loss (replicated): a scalar, or ``[..]`` with ``reduction="none"``.
    """
    input_layouts = (Shard(-1), Replicate())   # logits [.., vocab/t], target [..] (one per argument)
    output_layouts = Replicate()               # the loss

    def __init__(self, reduction: str = "mean", group=None, vocab_size: int | None = None,
                 fuse_sums: bool = False):
        super().__init__()
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        if vocab_size is not None and (isinstance(vocab_size, bool)
                                       or not isinstance(vocab_size, int) or vocab_size < 1):
            raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
        self.reduction, self.group, self.vocab_size = reduction, group, vocab_size
        self.fuse_sums = fuse_sums

    def check_equal_shards(self, width: int) -> None:
        """ValueError (on every rank alike) unless every rank holds ``vocab/t`` logit columns."""
        t = group_size(self.group)
        if self.vocab_size is not None:
            check_divisible("vocab_size", self.vocab_size, t)
            if width != self.vocab_size // t:
                raise ValueError(f"vocab_size={self.vocab_size} on {t} rank(s) needs logits "
                                 f"[.., {self.vocab_size // t}] on every rank; this rank holds "
                                 f"[.., {width}]")
            return
        if t == 1:
            return
        # [1] from every rank: an input check the ranks make together, not the loss's traffic
        widths = torch.cat(agree(torch.tensor([width]), self.group))
        if len(set(widths.tolist())) > 1:
            raise ValueError(f"the logits' vocabulary shards have widths {widths.tolist()} on the "
                             f"{t} ranks; they must be equal (vocab/t each, rank r holding tokens "
                             f"[r*vocab/t, (r+1)*vocab/t)): pad the vocabulary to a multiple of {t}")

    def all_reduce(self, x: torch.Tensor, operator: str,
                   op: dist.ReduceOp = dist.ReduceOp.SUM) -> torch.Tensor:
        """``[..]`` -> all-reduce (``op``) over the group -> ``[..]``, named ``operator`` in the
        records. One rank: a copy of ``x``, still recorded (0 bytes sent), so the record has the
        same three rows at every world size."""
        t = group_size(self.group)
        out = x.contiguous().clone()
        if t > 1:
            dist.all_reduce(out, op=op, group=self.group)
        note("all_reduce", x, out, REGION, operator, "forward", t)
        return out

    def combine_max(self, local_max: torch.Tensor) -> torch.Tensor:
        """``[..]`` -> all-reduce (max) -> ``[..]``, the max over the whole vocabulary."""
        return self.all_reduce(local_max, "max", dist.ReduceOp.MAX)

    def combine_sum_exp(self, local_sum: torch.Tensor) -> torch.Tensor:
        """``[..]`` -> all-reduce (sum) -> ``[..]``, sum of exp(z - mx) over the whole vocabulary."""
        return self.all_reduce(local_sum, "sum_exp")

    def combine_target_logit(self, picked: torch.Tensor) -> torch.Tensor:
        """``[..]`` -> all-reduce (sum) -> ``[..]``: only the owning rank's term is non-zero."""
        return self.all_reduce(picked, "target_logit")

    def combine_sums(self, local_sum: torch.Tensor, picked: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """The sum of exponentials and the target logit over the whole vocabulary: two
        all-reduces (``combine_sum_exp``, ``combine_target_logit``), or with ``fuse_sums`` one
        of ``[2, ..]`` -> ``[2, ..]``, recorded as one all-reduce (operator ``sum_exp+target_logit``)."""
        if not self.fuse_sums:
            return self.combine_sum_exp(local_sum), self.combine_target_logit(picked)
        both = self.all_reduce(torch.stack([local_sum, picked]), "sum_exp+target_logit")
        return both[0], both[1]

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if tuple(target.shape) != tuple(logits.shape[:-1]):
            raise ValueError(f"target {list(target.shape)} must have the leading shape of the "
                             f"logits {list(logits.shape)}")
        self.check_equal_shards(logits.shape[-1])
        vocab = logits.shape[-1] * group_size(self.group)
        if target.numel() and (int(target.min()) < 0 or int(target.max()) >= vocab):
            raise ValueError(f"target ids must lie in [0, {vocab}), got "
                             f"[{int(target.min())}, {int(target.max())}]")
        return _CrossEntropy.apply(logits, target, self, self.reduction)


def vocab_parallel_cross_entropy(logits_shard: torch.Tensor, target: torch.Tensor,
                                 reduction: str = "mean", group=None,
                                 vocab_size: int | None = None, fuse_sums: bool = False
                                 ) -> torch.Tensor:
    """``F.cross_entropy(full_logits, target, reduction=...)`` from this rank's ``[.., vocab/t]``
    columns (class dim last); ``target [..]`` holds global token ids, the same on every rank.
    Every token counts: there is no ``ignore_index`` (ids outside ``[0, vocab)`` are refused).
    Shards must be equal (ValueError otherwise); ``vocab_size=vocab`` lets each rank check its own
    width without the extra exchange of widths; ``fuse_sums`` all-reduces the sum of
    exponentials and the target logit together (two all-reduces instead of three)."""
    return VocabParallelCrossEntropy(reduction, group, vocab_size, fuse_sums)(logits_shard, target)
