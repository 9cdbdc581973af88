"""The online softmax: attention over key blocks one at a time, never the whole score row at once.

For one query row and key blocks ``S_1, S_2, ...`` (scores) with values ``V_1, V_2, ...`` keep the
running max ``mx``, the running sum ``l = sum exp(S - mx)`` and the running output
``acc = sum exp(S - mx) @ V``. A new block with a larger max ``mx'`` makes every earlier term
``exp(S - mx)`` too big by ``exp(mx' - mx)``, so ``l`` **and** ``acc`` are rescaled by
``shrink = exp(mx - mx')`` before the block is added (Milakov & Gimelshein 2018; FlashAttention,
Dao et al. 2022). At the end ``O = acc / l`` and the log-sum-exp ``lse = mx + log l`` is all the
backward needs to rebuild any probability: ``P = exp(S - lse)``.

Two finished partial results merge the same way through their lse (ring-flash-attention's
``update_out_and_lse``): ``lse = log(exp(lse1) + exp(lse2))``, ``O = O1 exp(lse1-lse) + O2 exp(lse2-lse)``.
"""
from __future__ import annotations

import torch

__all__ = ["online_update", "finish", "merge_partials", "online_softmax_rows"]


def _safe(mx: torch.Tensor) -> torch.Tensor:
    # a row that has seen only masked scores keeps mx = -inf; shift it by 0 so exp gives 0, not nan
    return torch.where(torch.isinf(mx), torch.zeros_like(mx), mx)


def online_update(mx: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, scores: torch.Tensor,
                  v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold one key block in: ``scores [.., rows, keys]`` (``-inf`` where masked), ``v [.., keys, d]``."""
    mx_new = torch.maximum(mx, scores.amax(-1, keepdim=True))    # [.., rows, 1]
    shift = _safe(mx_new)
    shrink = torch.exp(mx - shift)                               # [.., rows, 1]; 0 for the first block
    p = torch.exp(scores - shift)                                # [.., rows, keys]
    l = l * shrink + p.sum(-1, keepdim=True)                     # [.., rows, 1]
    acc = acc * shrink + p @ v                                   # [.., rows, keys] @ [.., keys, d] -> [.., rows, d]
    return mx_new, l, acc


def finish(mx: torch.Tensor, l: torch.Tensor, acc: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(O, lse)`` from the running state: ``O = acc / l``, ``lse = mx + log l``."""
    return acc / l, mx + torch.log(l)


def merge_partials(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Two attention results over disjoint key sets -> the result over their union."""
    lse = torch.logaddexp(lse1, lse2)
    return o1 * torch.exp(lse1 - lse) + o2 * torch.exp(lse2 - lse), lse


def online_softmax_rows(scores: torch.Tensor, v: torch.Tensor, block: int
                        ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Attention ``softmax(scores) @ v`` computed ``block`` keys at a time (for the notebook):
    returns ``O`` and the running max after each block."""
    mx = torch.full((*scores.shape[:-1], 1), -torch.inf, dtype=scores.dtype)
    l = torch.zeros_like(mx)
    acc = torch.zeros((*scores.shape[:-1], v.shape[-1]), dtype=scores.dtype)
    maxima = []
    for start in range(0, scores.shape[-1], block):
        mx, l, acc = online_update(mx, l, acc, scores[..., start:start + block],
                                   v[..., start:start + block, :])
        maxima.append(mx.clone())
    return finish(mx, l, acc)[0], maxima
