"""The one-process truth and the formulas a context-parallel run is measured against.

* ``reference_attention``: ``scaled_dot_product_attention`` on the full ``[b, heads, s, d]``
  tensors, forward and backward (PyTorch's own kernel, not the course's code).
* ``expected_work``: scores (query-key products) per (batch, head) rank r must compute when it
  skips every chunk pair the causal mask hides: chunk c sees ``c+1`` chunks of keys.
* ``expected_bytes`` / ``expected_kv_bytes``: what each rank sends, and the most K/V it holds.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mtb_helpers.cp.sharding import chunk_ids, chunk_len

__all__ = ["reference_attention", "expected_work", "expected_bytes", "expected_kv_bytes",
           "make_cp_inputs"]


def make_cp_inputs(batch: int, heads: int, seq: int, head_dim: int,
                   dtype: torch.dtype = torch.float32, seed: int = 0
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``q, k, v, dO``, each ``[b, heads, s, d]``, drawn from ``seed`` (the caller's random
    stream is left alone)."""
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, heads, seq, head_dim, generator=gen, dtype=torch.float64)
                 .to(dtype) for _ in range(4))


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor,
                        causal: bool) -> dict[str, torch.Tensor]:
    """``{"output", "q_grad", "k_grad", "v_grad"}`` of SDPA on the full sequence, in q's dtype."""
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out.backward(dout)
    return {"output": out.detach(), "q_grad": q.grad, "k_grad": k.grad, "v_grad": v.grad}


def expected_work(seq: int, world_size: int, rank: int, layout: str, causal: bool) -> int:
    """Scores per (batch, head) rank ``rank`` computes: all ``s/cp * s`` without a mask; with a
    causal one, each of its chunks ``c`` (of ``size`` positions) against the ``(c+1) size`` keys
    up to it."""
    if not causal:
        return seq // world_size * seq
    size = chunk_len(seq, world_size, layout)
    return sum(size * (c + 1) * size for c in chunk_ids(world_size, rank, layout))


def expected_bytes(variant: str, shard_bytes: int, world_size: int) -> dict[str, int]:
    """Bytes one rank sends, n = ``shard_bytes`` (its K shard). Ring: forward ``2(cp-1)n`` (K and
    V pass cp-1 hops), backward ``4(cp-1)n + 2n`` (K, V, dK, dV together, then dK, dV home).
    All-gather: ``2(cp-1)n`` each way (ring all-gather, then ring reduce-scatter)."""
    cp, n = world_size, shard_bytes
    if cp == 1:
        return {"forward": 0, "backward": 0}
    if variant == "ring":
        return {"forward": 2 * (cp - 1) * n, "backward": 4 * (cp - 1) * n + 2 * n}
    return {"forward": 2 * (cp - 1) * n, "backward": 2 * (cp - 1) * n}


def expected_kv_bytes(variant: str, shard_bytes: int, world_size: int) -> int:
    """The most K/V bytes a rank holds at once: the ring a block and the one arriving
    (``2 x 2n``), all-gather the whole sequence (``cp x 2n``)."""
    blocks = min(world_size, 2) if variant == "ring" else world_size
    return blocks * 2 * shard_bytes
