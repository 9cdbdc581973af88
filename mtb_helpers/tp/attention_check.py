"""``check_tp_attention``: ParallelSelfAttention on real ranks against one process.

    report = check_tp_attention(world_size=2, seq=4, batch=2, n_heads=4, head_dim=4)

Like the TP checks (``tp/check.py``), with ``wq, wk, wv, wo`` (``nn.Linear(h, h)``), ``x`` and
``dy`` ``[s, b, h]`` drawn from ``seed``; the reference runs the full projections and
``scaled_dot_product_attention`` over all ``n`` heads, each rank its heads (``from_full``). The
fused Q/K/V weight is compared in its rank-grouped order ``[Q_0, K_0, V_0, Q_1, ...]``
(``grouped_qkv``), so rank r's block of columns of ``W_qkv = weight.T [h, 3h]`` is its heads.
``bug=`` swaps in a wrong piece (``tp/attention_bugs.py``).
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch.distributed.tensor import Partial, Replicate, Shard

from mtb_helpers.checking.bug import Bug, resolve, swap
from mtb_helpers.checking.report import Report
from mtb_helpers.checking.tolerances import as_dtype, check_config, positive_sizes
from mtb_helpers.checking.trace import StepSpec as S
from mtb_helpers.comm.mesh import group_size
from mtb_helpers.comm.sharding import shard_range
from mtb_helpers.runtime.ranks import resolve_world_size
from mtb_helpers.tp.check import G_FWD, REPLICATE_X, f_backward_steps, run_traced
from mtb_helpers.tp.attention import (LocalAttention, ParallelSelfAttention, check_heads, group_heads,
                                      grouped_qkv)
from mtb_helpers.tp.layers import ColumnParallelLinear, RowParallelLinear
from mtb_helpers.tp.reference import draw_inputs

__all__ = ["check_tp_attention", "draw_attention_inputs", "attention_reference", "build_attention",
           "QUANTITIES"]


def draw_attention_inputs(seed: int, seq: int, batch: int, hidden: int, dtype=torch.float32):
    """``([wq, wk, wv, wo], x [s, b, h], dy [s, b, h])``: what the check draws for ``seed``."""
    return draw_inputs(seed, (seq, batch), as_dtype(dtype), *[(hidden, hidden)] * 4)


def attention_reference(layers, x, dy, t, *, n_heads: int, causal: bool) -> dict:
    """Every traced quantity on one process: full projections, all ``n`` heads at once."""
    wq, wk, wv, wo = layers
    s, b, h = x.shape
    x = x.clone().requires_grad_(True)
    q, k, v = wq(x), wk(x), wv(x)                                    # 3 x [s, b, h]

    def heads(z):                                                    # [s, b, h] -> [b, n, s, d]
        return z.reshape(s, b, n_heads, -1).permute(1, 2, 0, 3)

    ctx = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=causal)
    ctx = ctx.permute(2, 0, 1, 3).reshape(s, b, h)                   # [s, b, h]
    for z in (q, k, v, ctx):
        z.retain_grad()
    y = wo(ctx)
    y.backward(dy)
    w_o = wo.weight.detach().T                                       # [h, h], rows read heads
    w_qkv = group_heads([lin.weight.detach().T for lin in (wq, wk, wv)], t, 1)   # [h, 3h] grouped
    d_qkv = group_heads([q.grad, k.grad, v.grad], t, -1)                  # [s, b, 3h] grouped
    cuts = [slice(*shard_range(h, t, r)) for r in range(t)]
    cuts3 = [slice(*shard_range(3 * h, t, r)) for r in range(t)]
    d_attn, ctx = ctx.grad, ctx.detach()
    return {"qkv.weight": w_qkv, "out.weight": w_o, "input": x.detach(),
            "qkv": group_heads([q.detach(), k.detach(), v.detach()], t, -1), "attn": ctx,
            "partial": [ctx[..., c] @ w_o[c] for c in cuts], "reduced": ctx @ w_o,
            "output": y.detach(), "d_attn": d_attn, "d_qkv": d_qkv,
            "dx_partial": [d_qkv[..., c3] @ w_qkv[:, c3].T for c3 in cuts3],
            "input_grad": x.grad,
            "qkv.weight_grad": group_heads([lin.weight.grad.T for lin in (wq, wk, wv)], t, 1),
            "qkv.bias_grad": group_heads([lin.bias.grad for lin in (wq, wk, wv)], t, 0),
            "out.weight_grad": wo.weight.grad.T, "out.bias_grad": wo.bias.grad}


def build_attention(wq, wk, wv, wo, *, n_heads: int, causal: bool, bug: Bug | None):
    """``ParallelSelfAttention.from_full`` with ``bug``'s wrong piece swapped in (inside a rank)."""
    t = group_size()
    d = ParallelSelfAttention.validate(wq, wk, wv, wo, n_heads, t)
    qkv = swap(bug, ColumnParallelLinear).from_full(grouped_qkv(wq, wk, wv, t))
    out = swap(bug, RowParallelLinear).from_full(wo, input_is_parallel=True)
    core = swap(bug, LocalAttention)(n_heads, d, causal, t)
    return swap(bug, ParallelSelfAttention)(qkv, core, out)


def _specs() -> list[S]:
    return [
        S("qkv.weight", "shard Wq, Wk, Wv by heads", "forward", "Wqkv",
          "Wqkv_r = [Wq_r, Wk_r, Wv_r]", Shard(-1),
          ("param", "qkv.weight")),
        S("out.weight", "shard Wo by rows", "forward", "Wo",
          "Wo_r = Wo[rows r, :]", Shard(0), ("param", "out.weight")),
        REPLICATE_X,
        S("qkv", "Q, K, V of own heads", "forward", "QKV", "[Q_r, K_r, V_r] = X @ Wqkv_r + bias_r",
          Shard(-1), ("hook", "qkv", "out")),
        S("attn", "attention on own heads", "forward", "C",
          "C_r = softmax(Q_r K_r^T/sqrt d) V_r", Shard(-1), ("hook", "core", "out")),
        S("partial", "Wo local matmul", "forward", "Y", "Y^(r) = C_r @ Wo_r (no bias), handed to g",
          Partial(), ("record", "g", "forward", "in")),
        S("reduced", "all-reduce (g forward)", "forward", "Y", "sum_r Y^(r), on every rank", Replicate(),
          ("record", "g", "forward", "out"), G_FWD),
        S("output", "add bo once", "forward", "Y", "Y = sum_r Y^(r) + bo", Replicate(), ("output",)),
        S("d_attn", "context grad", "backward", "dC", "dC_r = dY @ Wo_r.T (g backward: identity)",
          Shard(-1), ("hook", "core", "grad_out")),
        S("out.weight_grad", "Wo weight grad", "backward", "dWo", "dWo_r = C_r.T @ dY", Shard(0),
          ("grad", "out.weight")),
        S("out.bias_grad", "Wo bias grad", "backward", "dbo", "dbo = dY summed over rows",
          Replicate(), ("grad", "out.bias")),
        S("d_qkv", "Q, K, V grads of own heads", "backward", "dQKV",
          "back through own heads", Shard(-1), ("hook", "qkv", "grad_out")),
        *f_backward_steps("dX^(r) = dQKV_r @ Wqkv_r.T"),
        S("qkv.weight_grad", "Wqkv weight grad", "backward", "dWqkv", "dWqkv_r = X.T @ dQKV_r",
          Shard(-1), ("grad", "qkv.weight")),
        S("qkv.bias_grad", "Wqkv bias grad", "backward", "dbqkv", "dbqkv_r = dQKV_r summed over rows",
          Shard(-1), ("grad", "qkv.bias")),
    ]


QUANTITIES = ("output", "input_grad", "qkv.weight_grad", "qkv.bias_grad", "out.weight_grad",
              "out.bias_grad")


def check_tp_attention(world_size: int = 2, seq: int = 4, batch: int = 2, n_heads: int = 4,
                       head_dim: int = 4, causal: bool = True, dtype=torch.float32, seed: int = 0,
                       bug: str | None = None, timeout: float = 30.0) -> Report:
    """``ParallelSelfAttention`` on ``world_size`` ranks, ``h = n_heads * head_dim``.

    x ``[seq, batch, h]`` is replicated; rank r owns heads ``r*n/t .. (r+1)*n/t - 1``: Q/K/V
    column-parallel (one f), attention local, Wo row-parallel (one g). Refuses ``n_heads`` not
    divisible by the world size before any rank starts.
    """
    dtype, t = as_dtype(dtype), resolve_world_size(world_size)
    positive_sizes(seq=seq, batch=batch, n_heads=n_heads, head_dim=head_dim)
    h = n_heads * head_dim
    check_heads(h, n_heads, t)
    wrong = resolve(bug, "tp_attention", head_dim=head_dim, world_size=t)
    layers, x, dy = draw_attention_inputs(seed, seq, batch, h, dtype)
    config = check_config(t, dtype, seed, bug, seq=seq, batch=batch, n_heads=n_heads,
                       head_dim=head_dim, causal=causal)
    return run_traced("tp_attention", config,
                      partial(build_attention, n_heads=n_heads, causal=causal, bug=wrong),
                      tuple(layers), x, dy, _specs(), [(q, q) for q in QUANTITIES],
                      partial(attention_reference, n_heads=n_heads, causal=causal), timeout)
