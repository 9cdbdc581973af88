"""Gradient buckets: the cap a user gives in MiB, in bytes, and PyTorch's rule for filling buckets.

One rule for everything that buckets gradients: ``OverlappedDDP`` (overlap.py) cuts its parameters
with it, and the α-β prediction (overlap_model.py, overlap_time.py) cuts byte counts with it, so a
predicted step and a measured one reduce the same buckets. Every entry point that takes
``bucket_cap_mb`` (the wrappers, ``check_overlap``, ``pytorch_overlap``, the prediction) turns it
into bytes with ``bucket_cap_bytes``: one conversion, one refusal.

    cap = bucket_cap_bytes(0.5)                      # 524 288.0 B (a MiB is 2**20 B, as DDP counts)
    model = nn.Sequential(*(nn.Linear(256, 256) for _ in range(3)))    # 263 168 B a layer
    assign_buckets(list(model.named_parameters()), cap)   # [[5, 4, 3, 2], [1, 0]]: indices per bucket
"""
from __future__ import annotations

import math
from typing import Any, Sequence

__all__ = ["bucket_cap_bytes", "assign_buckets"]


def bucket_cap_bytes(bucket_cap_mb: Any) -> float:
    """``bucket_cap_mb`` (MiB, as PyTorch's DDP counts them: 1 MiB = 2**20 B) in bytes; a
    ValueError naming the value for anything but a finite number >= 0 (before any rank starts)."""
    if (isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float))
            or not math.isfinite(bucket_cap_mb) or bucket_cap_mb < 0):
        raise ValueError(f"bucket_cap_mb must be a finite number >= 0 (MiB per gradient bucket; "
                         f"0 = one all-reduce per parameter), got {bucket_cap_mb!r}")
    return float(bucket_cap_mb) * 2 ** 20


def assign_buckets(named: Sequence[tuple[Any, Any]], cap_bytes: float) -> list[list[int]]:
    """Indices into ``named`` (given in registration order) per bucket, in reduce order: walk the
    parameters last to first; a dtype's open bucket closes once it holds ``>= cap_bytes``; buckets
    still open at the end follow, in the order their dtype first appeared (PyTorch's rule,
    ``compute_bucket_assignment_by_size``). Each entry is ``(name, tensor)``, or ``(name, bytes)``
    for a parameter known by its size only (all of one dtype: the α-β prediction)."""
    closed: list[list[int]] = []
    open_: dict[Any, tuple[list[int], int]] = {}
    for i in reversed(range(len(named))):
        param = named[i][1]
        dtype, nbytes = ((None, param) if isinstance(param, int)
                         else (param.dtype, param.numel() * param.element_size()))
        idx, size = open_.get(dtype, ([], 0))
        idx, size = idx + [i], size + nbytes
        if size >= cap_bytes:
            closed.append(idx)
            open_.pop(dtype, None)
        else:
            open_[dtype] = (idx, size)
    return closed + [idx for idx, _ in open_.values()]
