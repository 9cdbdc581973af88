"""Gradient buckets: the cap a user gives in MiB, in bytes, checked once for every caller.

``OverlappedDDP`` (overlap.py), ``check_overlap``, ``pytorch_overlap`` and the α-β prediction
(overlap_model.py, overlap_time.py) all take ``bucket_cap_mb``; each turns it into bytes here, so
one refusal and one conversion hold for all of them.

    bucket_cap_bytes(25.0)                           # 26 214 400.0 B (a MiB is 2**20 B, as DDP counts)
"""
from __future__ import annotations

import math
from typing import Any

__all__ = ["bucket_cap_bytes"]


def bucket_cap_bytes(bucket_cap_mb: Any) -> float:
    """``bucket_cap_mb`` (MiB, as PyTorch's DDP counts them: 1 MiB = 2**20 B) in bytes; a
    ValueError naming the value for anything but a finite number >= 0 (before any rank starts)."""
    if (isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float))
            or not math.isfinite(bucket_cap_mb) or bucket_cap_mb < 0):
        raise ValueError(f"bucket_cap_mb must be a finite number >= 0 (MiB per gradient bucket; "
                         f"0 = one all-reduce per parameter), got {bucket_cap_mb!r}")
    return float(bucket_cap_mb) * 2 ** 20
