"""The sequence-parallel check: ``SequenceParallelMLPBlock`` on real ranks against one process.

    report = check_sequence_parallel(world_size=2, seq_len=8, dropout_p=0.1)
    report.to_dict()["activation_memory"]    # bytes saved for backward, TP only vs TP + SP

Like the TP checks (``tp/check.py``): the caller draws the LayerNorm, both linears, X and dY
``[s, b, h]`` from ``seed`` and computes the reference on the full tensors (in the run's dtype and
in float64) with the same position-keyed dropout mask; every rank takes its sequence rows
``[s/t, b, h]``, runs the real block forward and backward (``trace.trace_on_rank``), and reports
every step; rows compare per rank the ``SP_QUANTITIES``. The same rank run measures the
activation memory of the block with TP only and with TP + SP (``sp/memory.py``). ``bug=`` swaps
in a broken part (``sp/bugs.py``).
"""
from __future__ import annotations

import copy
from contextlib import ExitStack
from functools import partial

import torch
import torch.nn.functional as F
from torch.distributed.tensor import Partial, Replicate, Shard

from mtb_helpers.checking.bug import resolve
from mtb_helpers.comm.regions import GATHER_SP, REDUCE_SCATTER_SP
from mtb_helpers.runtime.ranks import resolve_world_size, run
from mtb_helpers.checking.tolerances import as_dtype, check_config, number, positive_sizes
from mtb_helpers.checking.report import Report
from mtb_helpers.sp.layers import position_keyed_dropout
from mtb_helpers.sp.bugs import build_block
from mtb_helpers.sp.memory import (VARIANTS, check_block_sizes, counting_saved, make_block_inputs,
                                   measure_on_rank, memory_figures)
from mtb_helpers.comm.sharding import shard_range
from mtb_helpers.checking.trace import StepSpec as S, trace_on_rank, traced_report

__all__ = ["check_sequence_parallel", "SP_SPECS", "SP_QUANTITIES"]

RS, AG = REDUCE_SCATTER_SP, GATHER_SP

# In the order the block runs them (backward: the order autograd issues them).
SP_SPECS = [
    S("input", "shard X by sequence", "forward", "X", "X_r = X[seq rows r]", Shard(0), ("input",)),
    S("ln", "LayerNorm on the shard", "forward", "X_ln", "X_ln_r = LN(X_r)", Shard(0), ("hook", "ln", "out")),
    S("gathered", "all-gather along the sequence", "forward", "X_ln", "X_ln = [X_ln_0; ...]",
      Replicate(), ("record", AG, "forward", "out"), (AG, "forward")),
    S("fc1", "fc1 local matmul", "forward", "H", "H_r = X_ln @ W1_r + b1_r", Shard(-1), ("hook", "fc1", "out")),
    S("act", "GeLU", "forward", "Z", "Z_r = gelu(H_r)", Shard(-1), ("hook", "act", "out")),
    S("partial", "fc2 local matmul", "forward", "Y_fc2", "Y^(r) = Z_r @ W2_r (no bias)", Partial(),
      ("record", RS, "forward", "in")),
    S("scattered", "reduce-scatter along the sequence", "forward", "Y_fc2", "Y_sum_r = (sum_q P_q)[seq rows r]",
      Shard(0), ("record", RS, "forward", "out"), (RS, "forward")),
    S("fc2", "add b2 on the shard", "forward", "Y_fc2", "Y_fc2_r = Y_sum_r + b2", Shard(0), ("hook", "fc2", "out")),
    S("dropout", "dropout on the shard", "forward", "D", "D_r = mask[seq rows r] * Y_fc2_r / (1-dropout_p)", Shard(0),
      ("hook", "dropout", "out")),
    S("output", "residual on the shard", "forward", "Y", "Y_r = X_r + D_r", Shard(0), ("output",)),
    S("dz_shard", "dropout backward", "backward", "dY_fc2",
      "dY_fc2_r = mask[seq rows r] * dY_r / (1-dropout_p)", Shard(0), ("hook", "fc2", "grad_out")),
    S("fc2.bias_grad_partial", "fc2 bias grad of the shard", "backward", "db2", "db2_r = dY_fc2_r summed",
      Partial(), ("record", "fc2.bias", "backward", "in")),
    S("fc2.bias_grad", "all-reduce db2", "backward", "db2", "db2 = sum_r db2_r", Replicate(),
      ("grad", "fc2.bias"), ("fc2.bias", "backward")),
    S("dz_gathered", "all-gather dY_fc2 (reduce-scatter backward)", "backward", "dY_fc2",
      "dY_fc2 = [dY_fc2_0; ...]",
      Replicate(), ("record", RS, "backward", "out"), (RS, "backward")),
    S("d_act", "activation grad", "backward", "dZ", "dZ_r = dY_fc2 @ W2_r.T", Shard(-1),
      ("hook", "act", "grad_out")),
    S("fc2.weight_grad", "fc2 weight grad", "backward", "dW2", "dW2_r = Z_r.T @ dY_fc2", Shard(0),
      ("grad", "fc2.weight")),
    S("dl_partial", "local LayerNorm-output grad", "backward", "dX_ln", "dX_ln^r = dH_r @ W1_r.T", Partial(),
      ("record", AG, "backward", "in")),
    S("dl_shard", "reduce-scatter dX_ln (all-gather backward)", "backward", "dX_ln",
      "dX_ln_r = (sum_q dX_ln^q)[seq rows r]", Shard(0), ("record", AG, "backward", "out"), (AG, "backward")),
    S("fc1.weight_grad", "fc1 weight grad", "backward", "dW1", "dW1_r = X_ln.T @ dH_r", Shard(-1),
      ("grad", "fc1.weight")),
    S("fc1.bias_grad", "fc1 bias grad", "backward", "db1", "db1_r = dH_r summed", Shard(-1),
      ("grad", "fc1.bias")),
    S("input_grad", "input grad", "backward", "dX", "dX_r = dY_r + LN'(dX_ln_r)", Shard(0), ("input_grad",)),
    S("ln.bias_grad_partial", "LayerNorm bias grad of the shard", "backward", "d(ln.bias)",
      "d(ln.bias)_r = dX_ln_r summed",
      Partial(), ("record", "ln.bias", "backward", "in")),
    S("ln.bias_grad", "all-reduce d(ln.bias)", "backward", "d(ln.bias)",
      "d(ln.bias) = sum_r d(ln.bias)_r", Replicate(),
      ("grad", "ln.bias"), ("ln.bias", "backward")),
    S("ln.weight_grad_partial", "LayerNorm weight grad of the shard", "backward", "d(ln.weight)",
      "d(ln.weight)_r = (dX_ln_r * (X_r - mean)/std) summed", Partial(),
      ("record", "ln.weight", "backward", "in")),
    S("ln.weight_grad", "all-reduce d(ln.weight)", "backward", "d(ln.weight)",
      "d(ln.weight) = sum_r d(ln.weight)_r", Replicate(),
      ("grad", "ln.weight"), ("ln.weight", "backward")),
]
SP_QUANTITIES = [(k, k) for k in ("output", "dropout", "input_grad", "ln.weight_grad", "ln.bias_grad",
                                  "fc1.weight_grad", "fc1.bias_grad", "fc2.weight_grad", "fc2.bias_grad")]


def _reference(ln, fc1, fc2, x, dy, t: int, dropout_p: float, seed: int) -> dict:
    """Every step's tensor on one process (full ``[s, b, h]``, the global dropout mask); for a
    ``Partial()`` step the list of what each rank's share of the sum should be."""
    ln, fc1, fc2 = (copy.deepcopy(m) for m in (ln, fc1, fc2))
    x = x.clone().requires_grad_(True)
    l = ln(x)
    h = fc1(l)
    a = F.gelu(h)
    z = fc2(a)
    d = position_keyed_dropout(z, dropout_p, seed)
    y = x + d
    for v in (l, h, a, z):
        v.retain_grad()
    y.backward(dy)
    rows = [slice(*shard_range(x.shape[0], t, r)) for r in range(t)]
    cols = [slice(*shard_range(h.shape[-1], t, r)) for r in range(t)]
    w1, w2 = fc1.weight.detach().T, fc2.weight.detach().T          # [h, ffn], [ffn, h]
    xhat = F.layer_norm(x.detach(), ln.normalized_shape, eps=ln.eps)
    l_, a_ = l.detach(), a.detach()
    return {"input": x.detach(), "ln": l_, "gathered": l_, "fc1": h.detach(), "act": a_,
            "partial": [a_[..., c] @ w2[c] for c in cols], "scattered": a_ @ w2, "fc2": z.detach(),
            "dropout": d.detach(), "output": y.detach(), "dz_shard": z.grad,
            "fc2.bias_grad_partial": [z.grad[r].sum((0, 1)) for r in rows],
            "fc2.bias_grad": fc2.bias.grad, "dz_gathered": z.grad, "d_act": a.grad,
            "fc2.weight_grad": fc2.weight.grad.T, "dl_partial": [h.grad[..., c] @ w1[:, c].T for c in cols],
            "dl_shard": l.grad, "fc1.weight_grad": fc1.weight.grad.T, "fc1.bias_grad": fc1.bias.grad,
            "input_grad": x.grad,
            "ln.weight_grad_partial": [(l.grad * xhat)[r].sum((0, 1)) for r in rows],
            "ln.weight_grad": ln.weight.grad,
            "ln.bias_grad_partial": [l.grad[r].sum((0, 1)) for r in rows], "ln.bias_grad": ln.bias.grad}


def _on_rank(build, layers: tuple, x: torch.Tensor, dy: torch.Tensor, specs: list, dropout_p: float,
             seed: int, variants: tuple[str, ...], traced_is_sp: bool) -> dict:
    """Run on every rank: the traced block on this rank's sequence rows, then the memory figures.
    ``traced_is_sp`` (no bug: the traced block is the SP variant): the traced run's saved bytes
    and collectives are the SP variant's, so it is not run a second time (on 4 ranks sharing one
    CPU every gloo all-reduce or reduce-scatter costs ~6 ms)."""
    saved: dict[str, dict] = {}
    with ExitStack() as counting:
        def build_counted(*parts):
            module = build(*parts)
            saved["sp"] = counting.enter_context(counting_saved(module, x.shape[-1]))
            return module

        share = traced_is_sp and "sp" in variants
        # the block's layouts cut the rows
        result = trace_on_rank(build_counted if share else build, layers, x, dy, specs)
    result["memory"] = measure_on_rank(*layers, x, dy, dropout_p, seed,
                                       tuple(v for v in variants if not (share and v == "sp")))
    if share:
        result["memory"]["sp"] = {"saved": saved["sp"], "record": result["record"].to_list()}
    return result


def check_sequence_parallel(world_size: int = 2, seq_len: int = 8, batch: int = 2, hidden: int = 8,
                            ffn_hidden: int = 32, dropout_p: float = 0.1, dtype=torch.float32,
                            seed: int = 0, bug: str | None = None, timeout: float = 30.0,
                            memory_variants: tuple[str, ...] = tuple(VARIANTS),
                            link=None) -> Report:
    """``SequenceParallelMLPBlock`` on ``world_size`` ranks: ``y = x + dropout(fc2(gelu(fc1(LN(x)))))``.

    X ``[seq_len, batch, hidden]`` is split along the sequence, ``[s/t, b, h]`` per rank; fc1
    ``[hidden, ffn]`` is split on its columns, fc2 on its rows. Refuses (ValueError, before any
    rank starts) a ``seq_len`` or ``ffn_hidden`` the world size does not divide.
    ``memory_variants``: the block variants whose activation memory is measured too (``VARIANTS``).
    """

    dtype, t = as_dtype(dtype), resolve_world_size(world_size)
    if not set(memory_variants) <= set(VARIANTS):
        raise ValueError(f"memory_variants must be among {tuple(VARIANTS)}, got {memory_variants!r}")
    positive_sizes(seq_len=seq_len, batch=batch, hidden=hidden, ffn_hidden=ffn_hidden)
    number("dropout_p", dropout_p, lambda p: 0 <= p < 1, "a number in [0, 1)")
    check_block_sizes(seq_len, ffn_hidden, t)
    wrong = resolve(bug, "sequence", dropout_p=dropout_p)
    ln, fc1, fc2, x, dy = make_block_inputs(seq_len, batch, hidden, ffn_hidden, dtype, seed)
    build = partial(build_block, dropout_p=dropout_p, seed=seed, bug=wrong)
    results = run(_on_rank, build, (ln, fc1, fc2), x, dy, SP_SPECS, dropout_p, seed,
                  tuple(memory_variants), bug is None, world_size=t, timeout=timeout,
                  link=link)   # link=: an emulated link (cost/)
    refs = _reference(ln, fc1, fc2, x, dy, t, dropout_p, seed)
    refs64 = _reference(*(copy.deepcopy(m).double() for m in (ln, fc1, fc2)), x.double(), dy.double(),
                        t, dropout_p, seed)
    config = check_config(t, dtype, seed, bug, seq_len=seq_len, batch=batch, hidden=hidden,
                          ffn_hidden=ffn_hidden, dropout_p=dropout_p)
    memory = memory_figures([res.pop("memory") for res in results], seq_len, batch, hidden,
                            ffn_hidden, dtype, dropout_p)
    return traced_report("sequence_parallel", config, SP_SPECS, SP_QUANTITIES, results, refs,
                         refs64, dtype, extra={"activation_memory": memory})
