"""Sequence parallelism (Korthikanti et al. 2022): LayerNorm, dropout and the residual on sequence shards.

Tensor parallelism (``tp/layers.py``) leaves LayerNorm, dropout and the residual replicated: every rank
holds the whole ``[s, b, h]`` activation there. Sequence parallelism shards them along the sequence
(rank r holds ``[s/t, b, h]``, rows ``r*s/t .. (r+1)*s/t``) and swaps each all-reduce for an
all-gather plus a reduce-scatter, which together move the same bytes:

    x_r [s/t,b,h] -> LayerNorm -> all-gather (seq) -> fc1 column-split [s,b,ffn/t] -> GeLU
      -> fc2 row-split, partial [s,b,h] -> reduce-scatter (seq) [s/t,b,h] -> + b2 -> dropout -> + x_r

Two things need care:

* Replicated parameters that only see this rank's tokens (LayerNorm weight/bias, fc2's bias) get a
  partial grad; it is all-reduced over the group on its way back (``allreduce_sequence_parallel_grad``),
  so ``backward()`` returns with the full-sequence grad on every rank (``grad_sync="backward"``).
  With ``grad_sync="step"`` the layer leaves that grad partial (this rank's rows only) for one
  coalesced all-reduce after the step's last backward, as Megatron-LM's ``finalize_model_grads``
  (the capstone's ``capstone/finalize.py``).
* Dropout: the mask of element ``(i, j, k)`` of the global ``[s, b, h]`` tensor is a hash of its
  global position and the seed (``keep_mask``, in ``sp/dropout.py``), so every shard gets its own
  part of one global mask, whatever the world size, and a one-process reference can use the very
  same mask.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mtb_helpers.comm.mesh import group_rank, group_size
from mtb_helpers.comm.records import recorded
from mtb_helpers.comm.regions import (_ALL_GATHER, _REDUCE_SCATTER, GATHER_SP,  # torch 2.13's names, or older
                                      allreduce_sequence_parallel_grad,
                                      gather_from_sequence_parallel_region,
                                      reduce_scatter_to_sequence_parallel_region)
from mtb_helpers.comm.sharding import Replicate, Shard, shard_range
from mtb_helpers.sp.dropout import PositionKeyedDropout, keep_mask, position_keyed_dropout
from mtb_helpers.tp.layers import ColumnParallelLinear, ParallelMLP, RowParallelLinear

__all__ = ["GRAD_SYNCS", "check_grad_sync", "keep_mask", "position_keyed_dropout", "PositionKeyedDropout",
           "SequenceParallelLayerNorm", "SequenceParallelColumnLinear", "SequenceParallelRowLinear",
           "SequenceParallelMLPBlock", "TensorParallelMLPBlock", "layernorm_dropout_on_shard",
           "layernorm_dropout_reference"]

# when the grads of replicated parameters fed only this rank's sequence rows are summed over the group
GRAD_SYNCS = ("backward", "step")


def check_grad_sync(grad_sync: str) -> str:
    """``grad_sync`` if it is one of ``GRAD_SYNCS``, else a ValueError naming them."""
    if grad_sync not in GRAD_SYNCS:
        raise ValueError(f"grad_sync must be one of {', '.join(map(repr, GRAD_SYNCS))} ('backward': "
                         f"all-reduced over the group inside backward; 'step': left partial for "
                         f"one all-reduce per step), got {grad_sync!r}")
    return grad_sync


class SequenceParallelLayerNorm(nn.Module):
    """LayerNorm over ``h`` on this rank's ``[s/t, b, h]``; weight and bias ``[h]`` are replicated.
    ``grad_sync="backward"``: their grads are all-reduced over the group in backward; ``"step"``:
    left partial (this rank's rows) until the step sums them (``capstone/finalize.py``)."""
    input_layouts = output_layouts = Shard(0)   # [s/t, b, h]

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5,
                 name: str = "ln", group=None, grad_sync: str = "backward"):
        super().__init__()
        self.grad_sync = check_grad_sync(grad_sync)
        self.weight = nn.Parameter(weight.detach().clone())
        self.bias = nn.Parameter(bias.detach().clone())
        self.eps, self.name, self.group = eps, name, group

    @classmethod
    def from_full(cls, ln: nn.LayerNorm, name: str = "ln", group=None,
                  grad_sync: str = "backward") -> "SequenceParallelLayerNorm":
        """A copy of ``ln`` (same weight, bias, eps) for sequence shards."""
        if ln.weight is None or ln.bias is None or len(ln.normalized_shape) != 1:
            raise ValueError("SequenceParallelLayerNorm needs an nn.LayerNorm over the last dim "
                             "with elementwise_affine=True and a bias")
        return cls(ln.weight, ln.bias, ln.eps, name, group, grad_sync)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight, self.bias
        if self.grad_sync == "backward":   # "step": the grads stay partial until the step's sum
            weight = allreduce_sequence_parallel_grad(self.weight, f"{self.name}.weight", self.group)
            bias = allreduce_sequence_parallel_grad(self.bias, f"{self.name}.bias", self.group)
        return F.layer_norm(x, self.weight.shape, weight, bias, self.eps)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, grad_sync={self.grad_sync!r}"


@recorded(GATHER_SP)
class _GatherThenLinear(torch.autograd.Function):
    """forward: all-gather x along dim 0, then ``X @ W.T + bias``, saving only the shard ``[s/t, b, in]``;
    backward: all-gather x again (for dW), reduce-scatter dX along dim 0 (Megatron's choice)."""

    @staticmethod
    def forward(ctx, x, weight, bias, group):
        x = x.contiguous()
        full = x.new_empty((group_size(group) * x.shape[0], *x.shape[1:]))
        getattr(dist, _ALL_GATHER)(full, x, group=group)   # [s/t, b, in] -> [s, b, in]
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.has_bias = group, bias is not None
        return F.linear(full, weight, bias)   # [s, b, in] @ [in, out/t] -> [s, b, out/t]

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        full = x.new_empty((group_size(ctx.group) * x.shape[0], *x.shape[1:]))
        ctx.operator = "re-gather"   # how the record names this second all-gather of x
        getattr(dist, _ALL_GATHER)(full, x, group=ctx.group)   # [s/t, b, in] -> [s, b, in] again
        dy2 = dy.reshape(-1, dy.shape[-1])
        dw = dy2.T @ full.reshape(-1, full.shape[-1])   # [out/t, s*b] @ [s*b, in] -> [out/t, in]
        dbias = dy2.sum(0) if ctx.has_bias else None
        # [s, b, out/t] @ [out/t, in] -> [s, b, in] (partial) -> reduce-scatter -> [s/t, b, in]
        partial = (dy @ weight).contiguous()
        dx = partial.new_empty((partial.shape[0] // group_size(ctx.group), *partial.shape[1:]))
        ctx.operator = ""
        getattr(dist, _REDUCE_SCATTER)(dx, partial, group=ctx.group)
        return dx, dw, dbias, None


class SequenceParallelColumnLinear(ColumnParallelLinear):
    """fc1 under SP: ``x [s/t, b, in]`` -> all-gather along the sequence -> ``[s, b, out/t]``.

    The all-gather's backward reduce-scatters dX, which replaces f's all-reduce. With
    ``save_input_shard`` the layer keeps only ``x`` for backward and gathers it again there.
    """
    save_input_shard: bool = False
    input_layouts, output_layouts = Shard(0), Shard(-1)   # [s/t, b, in] -> [s, b, out/t]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.save_input_shard:
            return _GatherThenLinear.apply(x, self.weight, self.bias, self.group)
        full = gather_from_sequence_parallel_region(x, self.group)   # [s/t, b, in] -> [s, b, in]
        return F.linear(full, self.weight, self.bias)   # [s, b, in] @ [in, out/t] -> [s, b, out/t]


class SequenceParallelRowLinear(RowParallelLinear):
    """fc2 under SP: ``x [s, b, in/t]`` -> partial ``[s, b, out]`` -> reduce-scatter along the
    sequence -> ``[s/t, b, out]`` + bias (replicated; its grad synced like LayerNorm's, by
    ``grad_sync``)."""
    input_layouts, output_layouts = Shard(-1), Shard(0)   # [s, b, in/t] -> [s/t, b, out]

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, in_features: int,
                 out_features: int, input_is_parallel: bool = True, group=None,
                 grad_sync: str = "backward"):
        super().__init__(weight, bias, in_features, out_features, input_is_parallel, group)
        self.grad_sync = check_grad_sync(grad_sync)

    @classmethod
    def from_full(cls, linear: nn.Linear, input_is_parallel: bool = True,
                  group: dist.ProcessGroup | None = None,
                  grad_sync: str = "backward") -> "SequenceParallelRowLinear":
        """This rank's input columns of a full ``nn.Linear``; the bias stays whole, its grad
        summed over the group in backward (``"backward"``) or left partial (``"step"``)."""
        layer = super().from_full(linear, input_is_parallel, group)
        layer.grad_sync = check_grad_sync(grad_sync)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = F.linear(x, self.weight)   # [s, b, in/t] @ [in/t, out] -> [s, b, out] (partial)
        # [s, b, out] -> reduce-scatter along the sequence -> [s/t, b, out]
        y = reduce_scatter_to_sequence_parallel_region(partial, self.group)
        if self.bias is None:
            return y
        bias = self.bias
        if self.grad_sync == "backward":   # "step": the grad stays partial until the step's sum
            bias = allreduce_sequence_parallel_grad(self.bias, "fc2.bias", self.group)
        return y + bias

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, grad_sync={self.grad_sync!r}"


def _check_block(ln: nn.LayerNorm, fc1: nn.Linear, fc2: nn.Linear) -> None:
    h = ln.normalized_shape[-1]
    if fc1.in_features != h or fc2.out_features != h or fc1.out_features != fc2.in_features:
        raise ValueError(f"block shapes disagree: LayerNorm over {h}, fc1 {fc1.in_features}->"
                         f"{fc1.out_features}, fc2 {fc2.in_features}->{fc2.out_features}")


class SequenceParallelMLPBlock(nn.Module):
    """``y = x + dropout(fc2(gelu(fc1(layernorm(x)))))`` with ``x, y: [s/t, b, h]`` (this rank's
    sequence shard). Built from its parts so a check can swap in a broken one (``sp/bugs.py``)."""
    input_layouts = output_layouts = Shard(0)

    def __init__(self, ln: SequenceParallelLayerNorm, fc1: SequenceParallelColumnLinear,
                 fc2: SequenceParallelRowLinear, dropout: PositionKeyedDropout):
        super().__init__()
        self.ln, self.fc1, self.act, self.fc2, self.dropout = ln, fc1, nn.GELU(), fc2, dropout

    @classmethod
    def from_full(cls, ln: nn.LayerNorm, fc1: nn.Linear, fc2: nn.Linear, dropout_p: float = 0.1,
                  seed: int = 0, group: dist.ProcessGroup | None = None,
                  save_input_shard: bool = False,
                  grad_sync: str = "backward") -> "SequenceParallelMLPBlock":
        """Inside a rank: fc1 ``[ffn, h]`` split on its outputs, fc2 ``[h, ffn]`` on its inputs,
        LayerNorm and fc2's bias replicated. ``save_input_shard``: fc1 keeps only ``[s/t, b, h]``
        for backward and all-gathers it again there (less memory, one more all-gather).
        ``grad_sync``: the replicated grads summed in backward (``"backward"``) or left partial
        for the step (``"step"``)."""
        _check_block(ln, fc1, fc2)
        col = SequenceParallelColumnLinear.from_full(fc1, group=group)
        col.save_input_shard = save_input_shard
        return cls(SequenceParallelLayerNorm.from_full(ln, "ln", group, grad_sync), col,
                   SequenceParallelRowLinear.from_full(fc2, group=group, grad_sync=grad_sync),
                   PositionKeyedDropout(dropout_p, seed, sequence_parallel=True, group=group))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [s/t, b, h] -> LN -> fc1 (all-gather) -> [s, b, ffn/t] -> GeLU -> fc2 (reduce-scatter)
        # -> [s/t, b, h] -> dropout -> + x
        return x + self.dropout(self.fc2(self.act(self.fc1(self.ln(x)))))


class TensorParallelMLPBlock(nn.Module):
    """The same block with tensor parallelism only: ``x, y: [s, b, h]`` replicated on every rank;
    LayerNorm, dropout (same global mask on every rank) and the residual are replicated, the MLP
    is ``ParallelMLP`` (one all-reduce forward, one backward)."""

    def __init__(self, ln: nn.LayerNorm, mlp: ParallelMLP, dropout: PositionKeyedDropout):
        super().__init__()
        self.ln, self.mlp, self.dropout = ln, mlp, dropout

    @classmethod
    def from_full(cls, ln: nn.LayerNorm, fc1: nn.Linear, fc2: nn.Linear, dropout_p: float = 0.1,
                  seed: int = 0, group: dist.ProcessGroup | None = None) -> "TensorParallelMLPBlock":
        _check_block(ln, fc1, fc2)
        copy = nn.LayerNorm(ln.normalized_shape, eps=ln.eps, dtype=ln.weight.dtype)
        copy.load_state_dict(ln.state_dict())
        return cls(copy, ParallelMLP.from_full(fc1, fc2, group),
                   PositionKeyedDropout(dropout_p, seed, sequence_parallel=False, group=group))

    input_layouts = output_layouts = Replicate()   # [s, b, h]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [s, b, h] -> LN -> ParallelMLP (f ... g: one all-reduce) -> [s, b, h] -> dropout -> + x
        return x + self.dropout(self.mlp(self.ln(x)))


def layernorm_dropout_on_shard(ln: nn.LayerNorm, x: torch.Tensor, dy: torch.Tensor,
                               dropout_p: float = 0.1, seed: int = 0) -> dict:
    """The minimal demo, run on every rank. ``x``, ``dy``: the full ``[s, b, h]``; this rank takes
    its rows ``[s/t, b, h]``, applies LayerNorm (grads all-reduced) and position-keyed dropout,
    all-gathers the output ``[s, b, h]`` and back-propagates the full ``dy`` (the same on every
    rank, so the gather's backward only splits it). Returns this rank's view of the result."""
    t, r = group_size(), group_rank()
    lo, hi = shard_range(x.shape[0], t, r)
    x_r = x[lo:hi].clone().requires_grad_(True)
    norm = SequenceParallelLayerNorm.from_full(ln)
    y_r = PositionKeyedDropout(dropout_p, seed)(norm(x_r))
    y = gather_from_sequence_parallel_region(y_r, tensor_parallel_output_grad=False)
    y.backward(dy)
    return {"rows": (lo, hi), "shard": y_r.detach(), "output": y.detach(), "input_grad": x_r.grad,
            "ln.weight_grad": norm.weight.grad, "ln.bias_grad": norm.bias.grad}


def layernorm_dropout_reference(ln: nn.LayerNorm, x: torch.Tensor, dy: torch.Tensor,
                                dropout_p: float = 0.1, seed: int = 0) -> dict:
    """The same on one process over the whole ``[s, b, h]`` (the global dropout mask)."""
    x = x.clone().requires_grad_(True)
    ln.zero_grad()
    y = position_keyed_dropout(ln(x), dropout_p, seed)
    y.backward(dy)
    return {"output": y.detach(), "input_grad": x.grad, "ln.weight_grad": ln.weight.grad.clone(),
            "ln.bias_grad": ln.bias.grad.clone()}
