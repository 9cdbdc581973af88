"""Megatron-style tensor-parallel layers (Shoeybi et al. 2019), built inside a rank from full layers.

Notation, the course's one convention (notebooks, checks and figures use it): ``Y = X @ W + bias``
(``bias`` as PyTorch names it; ``b`` is the batch size) with ``W = weight.T`` of shape
``[in, out]``, so a column split is ``W = [W_0, ..., W_t-1]``. The layers store nn.Linear's
``.weight``, which is ``W.T``: ``[out, in]``. ``t`` ranks in the group, rank ``i`` holds shard
``i`` (contiguous, in rank order).

* ``ColumnParallelLinear`` splits W on the output dim: rank i holds the columns ``W_i`` of W
  (``.weight`` rows ``i*out/t:(i+1)*out/t``, ``[out/t, in]``) and ``bias_i`` (``[out/t]``), computes
  ``Y_i = X @ W_i + bias_i`` (``[.., out/t]``) and, with ``gather_output=True``, all-gathers the full
  ``Y``. X enters through ``f`` (copy), whose backward all-reduces dX: every rank's
  ``dX_i = dY_i @ W_i.T`` is only a partial sum.
* ``RowParallelLinear`` splits W on the input dim: rank i holds the rows ``W_i`` of W (``.weight``
  columns, ``[out, in/t]``) and the full bias; ``Y = g(X_i @ W_i) + bias``: the partial products are
  all-reduced by ``g`` and the bias appears once in the sum (added after the reduce here).
* ``ParallelMLP``: column fc1 -> exact (erf) GeLU -> row fc2. The ``[.., ffn/t]`` activation never
  leaves its rank: one all-reduce forward (g) and one backward (f).

Deliberate bugs for the checks are subclasses that override ``forward``
(``mtb_helpers.tp.bugs``); these layers contain no code path that exists for a test.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mtb_helpers.comm.sharding import Replicate, Shard, check_divisible, shard_range
from mtb_helpers.comm.mesh import group_rank, group_size
from mtb_helpers.comm.regions import (copy_to_tensor_model_parallel_region,
                                      gather_from_tensor_model_parallel_region,
                                      reduce_from_tensor_model_parallel_region,
                                      scatter_to_tensor_model_parallel_region)

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "ParallelMLP", "TensorParallelPlan",
           "check_divisible", "shard_range"]


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.detach().clone().contiguous())


class ColumnParallelLinear(nn.Module):
    """``Y_i = f(X) @ W_i + bias_i``; ``.weight`` is ``W_i.T``, ``[out/t, in]``; ``.bias`` is ``[out/t]``.

    forward: ``x [.., in]`` (replicated on every rank) -> ``[.., out/t]`` (this rank's columns
    of Y), or ``[.., out]`` with ``gather_output=True``.
    """
    input_layouts = Replicate()   # X [.., in] whole on every rank

    @property
    def output_layouts(self) -> Replicate | Shard:
        """``Shard(-1)``: this rank's columns ``[.., out/t]``; ``Replicate()`` after the all-gather."""
        return Replicate() if self.gather_output else Shard(-1)

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, in_features: int,
                 out_features: int, gather_output: bool = False, group=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.gather_output, self.group = gather_output, group
        self.weight = _param(weight)
        self.bias = _param(bias) if bias is not None else None

    @classmethod
    def from_full(cls, linear: nn.Linear, gather_output: bool = False,
                  group: dist.ProcessGroup | None = None) -> "ColumnParallelLinear":
        """This rank's output rows of a full ``nn.Linear`` (every rank passes the same one)."""
        t, r = group_size(group), group_rank(group)
        check_divisible(f"{cls.__name__}: out_features", linear.out_features, t)
        lo, hi = shard_range(linear.out_features, t, r)
        bias = linear.bias[lo:hi] if linear.bias is not None else None
        return cls(linear.weight[lo:hi], bias, linear.in_features, linear.out_features,
                   gather_output, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to_tensor_model_parallel_region(x, self.group)   # [.., in] -> f -> [.., in]
        y = F.linear(x, self.weight, self.bias)   # [.., in] @ [in, out/t] -> [.., out/t]
        if self.gather_output:
            # [.., out/t] -> all-gather -> [.., out]
            y = gather_from_tensor_model_parallel_region(y, self.group)
        return y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"(shard {tuple(self.weight.shape)}), gather_output={self.gather_output}")


class RowParallelLinear(nn.Module):
    """``Y = g(X_i @ W_i) + bias``; ``.weight`` is ``W_i.T``, ``[out, in/t]``; ``.bias`` is the full ``[out]``.

    forward: ``x [.., in/t]`` (this rank's columns of X; with ``input_is_parallel=False`` the
    full ``[.., in]``, split here) -> ``[.., out]``, the same full Y on every rank.
    """
    output_layouts = Replicate()   # Y [.., out], the same on every rank after g

    @property
    def input_layouts(self) -> Replicate | Shard:
        """``Shard(-1)``: this rank's columns ``[.., in/t]``; ``Replicate()`` when split here."""
        return Shard(-1) if self.input_is_parallel else Replicate()

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, in_features: int,
                 out_features: int, input_is_parallel: bool = True, group=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel, self.group = input_is_parallel, group
        self.weight = _param(weight)
        self.bias = _param(bias) if bias is not None else None

    @classmethod
    def from_full(cls, linear: nn.Linear, input_is_parallel: bool = True,
                  group: dist.ProcessGroup | None = None) -> "RowParallelLinear":
        """This rank's input columns of a full ``nn.Linear``; the bias stays whole."""
        t, r = group_size(group), group_rank(group)
        check_divisible(f"{cls.__name__}: in_features", linear.in_features, t)
        lo, hi = shard_range(linear.in_features, t, r)
        return cls(linear.weight[:, lo:hi], linear.bias, linear.in_features, linear.out_features,
                   input_is_parallel, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = scatter_to_tensor_model_parallel_region(x, self.group)   # [.., in] -> [.., in/t]
        partial = F.linear(x, self.weight)   # [.., in/t] @ [in/t, out] -> [.., out] (partial)
        y = reduce_from_tensor_model_parallel_region(partial, self.group)   # g: all-reduce [.., out]
        # bias must enter the sum once: added after g here (every rank adding it before g: t x bias).
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"(shard {tuple(self.weight.shape)}), input_is_parallel={self.input_is_parallel}")


class ParallelMLP(nn.Module):
    """``Y = fc2(gelu(fc1(X)))`` with fc1 column- and fc2 row-parallel; ``x, y: [.., h]``.

    The activation between them is ``[.., ffn/t]`` on each rank and is never communicated.
    """
    input_layouts = output_layouts = Replicate()

    def __init__(self, fc1: ColumnParallelLinear, fc2: RowParallelLinear):
        super().__init__()
        if fc1.gather_output or not fc2.input_is_parallel:
            raise ValueError("ParallelMLP keeps the activation sharded: fc1 needs "
                             "gather_output=False and fc2 input_is_parallel=True")
        self.fc1, self.act, self.fc2 = fc1, nn.GELU(approximate="none"), fc2

    @classmethod
    def from_full(cls, fc1: nn.Linear, fc2: nn.Linear,
                  group: dist.ProcessGroup | None = None) -> "ParallelMLP":
        """fc1 ``[ffn, h]`` split on its output dim, fc2 ``[h, ffn]`` on its input dim."""
        if fc1.out_features != fc2.in_features:
            raise ValueError(f"fc1.out_features={fc1.out_features} must equal "
                             f"fc2.in_features={fc2.in_features}")
        return cls(ColumnParallelLinear.from_full(fc1, gather_output=False, group=group),
                   RowParallelLinear.from_full(fc2, input_is_parallel=True, group=group))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [.., h] -> fc1 -> [.., ffn/t] -> GeLU -> fc2 (g) -> [.., h]
        return self.fc2(self.act(self.fc1(x)))


# PyTorch's names for these layers, for the comparisons of tp/pytorch.py (DTensor is imported only
# when a plan is built, on the ranks). Here, not in tp/pytorch.py: tp/bugs.py subclasses it, and
# the bug registry, which every check loads, must not load a comparison module (runtime/start.py
# preloads DTensor's debug mode, ~0.8 s and ~35 MB a rank, wherever one is loaded).
class TensorParallelPlan:
    """The ``parallelize_module`` plan of each comparison: a column layer is ``ColwiseParallel``,
    a row layer ``RowwiseParallel``, the MLP ``{"0": Colwise, "2": Rowwise}`` (the indices of
    ``nn.Sequential(fc1, GELU, fc2)``). A bug overrides one method with a wrong placement."""

    def column(self):
        from torch.distributed.tensor.parallel import ColwiseParallel
        return ColwiseParallel()          # weight Shard(0), input Replicate, output Shard(-1)

    def row(self):
        from torch.distributed.tensor.parallel import RowwiseParallel
        return RowwiseParallel()          # weight Shard(1), input Shard(-1), output Replicate

    def plan(self, kind: str):
        if kind == "mlp":
            return {"0": self.column(), "2": self.row()}
        return self.column() if kind == "column" else self.row()
