"""Tensor-parallel checks: the real layers on real ranks against a one-process reference.

    report = check_column_parallel(world_size=2, in_features=8, out_features=12)
    report.passed, report.rows, report.steps, report.records, report.to_dict(); print(report)

Every check draws X, the layer's weights and the upstream grad dY from ``seed`` in the caller,
computes the reference here (``nn.Linear``/GeLU on the full tensors, in the run's dtype and in
float64), ships the full tensors to every rank, where each rank takes its own shard and runs the
real layer from ``tp/layers.py`` forward and backward, and compares per rank: forward output, input grad,
weight grad, bias grad (``report.rows``), plus every intermediate step (``report.steps``).
``bug=`` swaps in the layer with that bug (``tp/bugs.py``); the check must then fail.
"""
from __future__ import annotations

from functools import partial

import torch
from torch.distributed.tensor import Partial, Replicate, Shard

from mtb_helpers.checking.bug import resolve, swap
from mtb_helpers.runtime.ranks import resolve_world_size, run
from mtb_helpers.checking.report import Report
from mtb_helpers.checking.tolerances import as_dtype, check_config, positive_sizes
from mtb_helpers.comm.sharding import check_divisible
from mtb_helpers.tp.bugs import build_mlp
from mtb_helpers.tp.layers import ColumnParallelLinear, RowParallelLinear
from mtb_helpers.tp.reference import cast_linear, draw_inputs, linear_reference, mlp_reference
from mtb_helpers.checking.trace import StepSpec as S, trace_on_rank, traced_report

__all__ = ["check_column_parallel", "check_row_parallel", "check_tp_mlp"]

F_BWD, G_FWD = ("f", "backward"), ("g", "forward")
GATHER = "gather_from_tensor_model_parallel_region"
SCATTER = "scatter_to_tensor_model_parallel_region"
# the first step of every layer that starts with f: X as it came, on every rank
REPLICATE_X = S("input", "replicate X", "forward", "X", "every rank holds X (f: identity)", Replicate(), ("input",))


def _setup(world_size: int, dtype, batch_shape, split: str, **dims: int):
    """``(dtype, t, batch_shape)``, refusing a size that is not positive and a ``split`` dim
    (one of ``dims``) the world size does not divide."""
    dtype, t, batch = as_dtype(dtype), resolve_world_size(world_size), tuple(batch_shape)
    positive_sizes(**dims, **{f"batch_shape[{i}]": n for i, n in enumerate(batch)})
    check_divisible(split, dims[split], t)
    return dtype, t, batch


def run_traced(name: str, config: dict, build, layers, x, dy, specs, quantities,
               reference, timeout: float, link=None) -> Report:
    """Every rank runs ``build(*layers)`` on its pieces of ``x`` and ``dy`` (``trace_on_rank``);
    ``reference(layers, x, dy, t)`` gives every traced tensor on one process, in the run's dtype
    and in float64; the report compares each rank's with its piece."""
    t, dtype = config["world_size"], x.dtype
    results = run(trace_on_rank, build, layers, x, dy, specs,
                  world_size=t, timeout=timeout, link=link)
    refs = reference(tuple(cast_linear(lin, dtype) for lin in layers), x, dy, t)
    refs64 = reference(tuple(cast_linear(lin, torch.float64) for lin in layers), x.double(),
                       dy.double(), t)
    return traced_report(name, config, specs, quantities, results, refs, refs64, dtype)


def f_backward_steps(local_formula: str) -> list[S]:
    """The two steps of ``f``'s backward every column-parallel entry has: each rank's partial input
    grad (``local_formula``), then the all-reduce that sums them into the whole dX."""
    return [S("dx_partial", "local input grad", "backward", "dX", local_formula, Partial(),
              ("record", "f", "backward", "in")),
            S("input_grad", "all-reduce dX (f backward)", "backward", "dX", "dX = sum_r dX^(r)",
              Replicate(), ("input_grad",), F_BWD)]


def check_column_parallel(world_size: int = 2, in_features: int = 8, out_features: int = 12,
                          batch_shape: tuple[int, ...] = (2, 3), dtype=torch.float32, seed: int = 0,
                          bug: str | None = None, gather_output: bool = False,
                          timeout: float = 30.0) -> Report:
    """``ColumnParallelLinear`` on ``world_size`` ranks: W ``[in, out]`` split on ``out``.

    X ``[*batch_shape, in]`` is replicated; rank r computes ``Y_r = X @ W_r + bias_r`` ``[.., out/t]``
    (all-gathered to ``[.., out]`` with ``gather_output``); f all-reduces dX in backward.
    """
    dtype, t, batch = _setup(world_size, dtype, batch_shape, "out_features",
                             in_features=in_features, out_features=out_features)
    wrong = resolve(bug, "column", gather_output=gather_output)
    (lin,), x, dy = draw_inputs(seed, batch, dtype, (in_features, out_features))
    gathered = [S("output", "all-gather Y", "forward", "Y", "Y = [Y_0, ..., Y_t-1]", Replicate(),
                  ("output",), (GATHER, "forward"))] if gather_output else []
    specs = [
        S("weight", "shard W by columns", "forward", "W", "W_r = W[:, cols r]", Shard(-1),
          ("param", "weight")),
        S("bias", "shard bias", "forward", "bias", "bias_r = bias[cols r]", Shard(-1),
          ("param", "bias")),
        REPLICATE_X,
        S("local", "local matmul", "forward", "Y", "Y_r = X @ W_r + bias_r", Shard(-1),
          ("record", GATHER, "forward", "in") if gather_output else ("output",)),
        *gathered,
        *f_backward_steps("dX^(r) = dY_r @ W_r.T"),
        S("weight_grad", "weight grad", "backward", "dW", "dW_r = X.T @ dY_r", Shard(-1),
          ("grad", "weight")),
        S("bias_grad", "bias grad", "backward", "dbias", "dbias_r = dY_r summed over rows", Shard(-1),
          ("grad", "bias")),
    ]
    quantities = [("output", "output" if gather_output else "local"), ("input_grad", "input_grad"),
                  ("weight_grad", "weight_grad"), ("bias_grad", "bias_grad")]
    config = check_config(t, dtype, seed, bug, in_features=in_features, out_features=out_features,
                     batch_shape=list(batch), gather_output=gather_output)
    build = partial(swap(wrong, ColumnParallelLinear).from_full, gather_output=gather_output)
    return run_traced("column_parallel", config, build, (lin,), x, dy, specs, quantities,
                      linear_reference, timeout)


def check_row_parallel(world_size: int = 2, in_features: int = 12, out_features: int = 8,
                       batch_shape: tuple[int, ...] = (2, 3), dtype=torch.float32, seed: int = 0,
                       bug: str | None = None, input_is_parallel: bool = True,
                       timeout: float = 30.0) -> Report:
    """``RowParallelLinear`` on ``world_size`` ranks: W ``[in, out]`` split on ``in``.

    Rank r holds X_r ``[*batch_shape, in/t]`` (or the full X, split by the layer, when
    ``input_is_parallel=False``), computes the partial ``X_r @ W_r`` ``[.., out]``; g all-reduces
    the partials and the full bias is added once, after the sum.
    """
    dtype, t, batch = _setup(world_size, dtype, batch_shape, "in_features",
                             in_features=in_features, out_features=out_features)
    wrong = resolve(bug, "row")
    (lin,), x, dy = draw_inputs(seed, batch, dtype, (in_features, out_features))
    if input_is_parallel:
        given = [S("input", "shard X by columns", "forward", "X", "X_r = X[:, cols r]", Shard(-1),
                   ("input",))]
        dx = [S("input_grad", "local input grad", "backward", "dX", "dX_r = dY @ W_r.T", Shard(-1),
                ("input_grad",))]
    else:
        given = [S("input", "replicate X", "forward", "X", "every rank holds X", Replicate(),
                   ("input",)),
                 S("x_shard", "split X (scatter)", "forward", "X",
                   "X_r = X[:, cols r], no communication", Shard(-1),
                   ("record", SCATTER, "forward", "out"), (SCATTER, "forward"))]
        dx = [S("dx_shard", "local input grad", "backward", "dX", "dX_r = dY @ W_r.T", Shard(-1),
                ("record", SCATTER, "backward", "in")),
              S("input_grad", "all-gather dX (scatter backward)", "backward", "dX",
                "dX = [dX_0, ..., dX_t-1]", Replicate(), ("input_grad",), (SCATTER, "backward"))]
    specs = [
        S("weight", "shard W by rows", "forward", "W", "W_r = W[rows r, :]", Shard(0),
          ("param", "weight")),
        S("bias", "replicate bias", "forward", "bias", "every rank holds all of bias", Replicate(),
          ("param", "bias")),
        *given,
        S("partial", "local matmul", "forward", "Y", "Y^(r) = X_r @ W_r (no bias), handed to g",
          Partial(), ("record", "g", "forward", "in")),
        S("reduced", "all-reduce (g forward)", "forward", "Y", "Y_sum = sum_r Y^(r)", Replicate(),
          ("record", "g", "forward", "out"), G_FWD),
        S("output", "add bias once", "forward", "Y", "Y = Y_sum + bias", Replicate(), ("output",)),
        *dx,
        S("weight_grad", "weight grad", "backward", "dW", "dW_r = X_r.T @ dY", Shard(0),
          ("grad", "weight")),
        S("bias_grad", "bias grad", "backward", "dbias", "dbias = dY summed over rows", Replicate(),
          ("grad", "bias")),
    ]
    quantities = [(k, k) for k in ("output", "input_grad", "weight_grad", "bias_grad")]
    config = check_config(t, dtype, seed, bug, in_features=in_features, out_features=out_features,
                     batch_shape=list(batch), input_is_parallel=input_is_parallel)
    return run_traced("row_parallel", config,
                      partial(swap(wrong, RowParallelLinear).from_full, input_is_parallel=input_is_parallel),
                      (lin,), x, dy, specs, quantities, linear_reference, timeout)


def check_tp_mlp(world_size: int = 2, hidden: int = 6, ffn_hidden: int = 24,
                 batch_shape: tuple[int, ...] = (2, 3), dtype=torch.float32, seed: int = 0,
                 bug: str | None = None, timeout: float = 30.0, link=None) -> Report:
    """``ParallelMLP`` on ``world_size`` ranks: ``Y = gelu(X @ W1 + b1) @ W2 + b2``.
    ``link=`` (``mtb_helpers.cost.Link``): the same check under an emulated link.

    X ``[*batch_shape, hidden]`` is replicated; W1 ``[hidden, ffn]`` is split on its columns and
    W2 ``[ffn, hidden]`` on its rows, so the activation ``[.., ffn/t]`` stays on its rank: one
    all-reduce forward (g), one backward (f).
    """
    dtype, t, batch = _setup(world_size, dtype, batch_shape, "ffn_hidden", hidden=hidden,
                             ffn_hidden=ffn_hidden)
    wrong = resolve(bug, "mlp")
    (fc1, fc2), x, dy = draw_inputs(seed, batch, dtype, (hidden, ffn_hidden), (ffn_hidden, hidden))
    # fc1's backward gives dX^(r), dW1_r and db1_r at once; f's all-reduce of dX runs after it, last
    dx_partial, dx_sum = f_backward_steps("dX^(r) = dH_r @ W1_r.T")
    specs = [
        S("fc1.weight", "shard W1 by columns", "forward", "W1", "W1_r = W1[:, cols r]", Shard(-1),
          ("param", "fc1.weight")),
        S("fc2.weight", "shard W2 by rows", "forward", "W2", "W2_r = W2[rows r, :]", Shard(0),
          ("param", "fc2.weight")),
        REPLICATE_X,
        S("fc1", "fc1 local matmul", "forward", "H", "H_r = X @ W1_r + b1_r", Shard(-1),
          ("hook", "fc1", "out")),
        S("act", "GeLU on the shard", "forward", "Z", "Z_r = gelu(H_r)", Shard(-1),
          ("hook", "act", "out")),
        S("partial", "fc2 local matmul", "forward", "Y", "Y^(r) = Z_r @ W2_r (no bias), handed to g",
          Partial(), ("record", "g", "forward", "in")),
        S("reduced", "all-reduce (g forward)", "forward", "Y", "Y_sum = sum_r Y^(r)", Replicate(),
          ("record", "g", "forward", "out"), G_FWD),
        S("output", "add b2 once", "forward", "Y", "Y = Y_sum + b2", Replicate(), ("output",)),
        S("d_act", "activation grad", "backward", "dZ", "dZ_r = dY @ W2_r.T (g backward: identity)",
          Shard(-1), ("hook", "act", "grad_out")),
        S("fc2.weight_grad", "fc2 weight grad", "backward", "dW2", "dW2_r = Z_r.T @ dY", Shard(0),
          ("grad", "fc2.weight")),
        S("fc2.bias_grad", "fc2 bias grad", "backward", "db2", "db2 = dY summed over rows",
          Replicate(), ("grad", "fc2.bias")),
        dx_partial,
        S("fc1.weight_grad", "fc1 weight grad", "backward", "dW1", "dW1_r = X.T @ dH_r", Shard(-1),
          ("grad", "fc1.weight")),
        S("fc1.bias_grad", "fc1 bias grad", "backward", "db1", "db1_r = dH_r summed over rows",
          Shard(-1), ("grad", "fc1.bias")),
        dx_sum,
    ]
    quantities = [(k, k) for k in ("output", "input_grad", "fc1.weight_grad", "fc1.bias_grad",
                                   "fc2.weight_grad", "fc2.bias_grad")]
    config = check_config(t, dtype, seed, bug, hidden=hidden, ffn_hidden=ffn_hidden,
                     batch_shape=list(batch))
    return run_traced("tp_mlp", config, partial(build_mlp, bug=wrong), (fc1, fc2), x, dy, specs,
                      quantities, mlp_reference, timeout, link=link)
