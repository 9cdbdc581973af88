"""PyTorch's own ring attention on the same ranks, next to the course's.

PyTorch ships context parallelism as ``torch.distributed.tensor.experimental.context_parallel``
(a context manager that swaps SDPA for ring attention on DTensor shards). Underneath it are
``_templated_ring_attention`` and ``_templated_ring_attention_backward`` (private, in
``torch/distributed/tensor/experimental/_context_parallel/_attention.py``, torch 2.13): K/V
rotate around the group, partial outputs merge through their log-sum-exp, and in the backward
dK/dV rotate with K/V, as here. They run on CPU with the CPU flash-attention kernel, so on gloo
ranks the two implementations can be compared on the very same shards. Their "load balance"
option is the zigzag layout (rank r holds chunks r and 2·cp-1-r). Private API: it may move in a
later torch: they are reached only through ``runtime/compat.py``, which then raises
``PrivateAPIMissing`` naming what moved instead of returning numbers.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from mtb_helpers.cp.reference import make_cp_inputs
from mtb_helpers.cp.ring import ring_attention
from mtb_helpers.cp.sharding import check_sequence, shard_sequence
from mtb_helpers.runtime.compat import pytorch_ring
from mtb_helpers.runtime.ranks import resolve_world_size, run

__all__ = ["compare_with_pytorch", "pytorch_ring_attention"]


def pytorch_ring_attention(q, k, v, dout, causal: bool, layout: str):
    """On a rank: PyTorch's ring attention forward and backward on this rank's shards
    ``[b, heads, s/cp, d]``; returns ``(out, dq, dk, dv)``. Its options are restored afterwards."""
    aten = torch.ops.aten
    group = dist.group.WORLD
    with pytorch_ring(load_balance=layout == "zigzag") as (forward, backward):
        out, lse, *_ = forward(
            group, 2, aten._scaled_dot_product_flash_attention_for_cpu, q, k, v, is_causal=causal)
        dq, dk, dv, *_ = backward(
            group, 2, aten._scaled_dot_product_flash_attention_for_cpu_backward.default, dout,
            "grad_out", q, k, v, out, lse, causal, dropout_p=0.0)
    return out, dq, dk, dv


def _on_rank(q, k, v, dout, causal: bool, layout: str) -> dict[str, float]:
    cp, r = dist.get_world_size(), dist.get_rank()
    shards = [shard_sequence(x, cp, r, layout) for x in (q, k, v, dout)]
    theirs = pytorch_ring_attention(*shards, causal, layout)
    mine = [x.clone().requires_grad_(True) for x in shards[:3]]
    out = ring_attention(*mine, causal=causal, layout=layout)
    out.backward(shards[3])
    ours = (out.detach(), *(x.grad for x in mine))
    return {name: float((a - b).abs().max())
            for name, a, b in zip(("output", "q_grad", "k_grad", "v_grad"), ours, theirs)}


def compare_with_pytorch(world_size: int = 2, seq: int = 16, heads: int = 2, head_dim: int = 4,
                         causal: bool = True, layout: str = "contiguous", seed: int = 0,
                         batch: int = 1) -> list[dict[str, float]]:
    """Max abs difference, per rank and quantity, between the course's ``ring_attention`` and
    PyTorch's ring attention on the same float64 shards (PyTorch's zigzag needs ``causal``)."""
    cp = resolve_world_size(world_size)
    check_sequence(seq, cp, layout)
    if layout == "zigzag" and not causal:
        raise ValueError("PyTorch's load-balanced (zigzag) ring attention requires causal=True")
    q, k, v, dout = make_cp_inputs(batch, heads, seq, head_dim, torch.float64, seed)
    return run(_on_rank, q, k, v, dout, causal, layout, world_size=cp)
