"""Gradient buckets (dp/buckets.py): one conversion of ``bucket_cap_mb`` to bytes with one refusal,
used by every entry point that takes a cap."""
from __future__ import annotations

from pathlib import Path

import pytest

from mtb_helpers.cost import Link
from mtb_helpers.dp.buckets import bucket_cap_bytes
from mtb_helpers.dp.overlap_check import check_overlap
from mtb_helpers.dp.overlap_model import predict_ddp
from mtb_helpers.dp.overlap_pytorch import pytorch_overlap
from mtb_helpers.dp.overlap_time import bucket_curve, measure_ddp

DP = Path(__file__).resolve().parents[1] / "mtb_helpers" / "dp"
LINK = Link(1e-3, 1e6)


def test_a_cap_is_mib_as_pytorch_s_ddp_counts_them():
    assert bucket_cap_bytes(25) == 25 * 1024 * 1024 == 26_214_400.0
    assert bucket_cap_bytes(0.5) == 524_288.0
    assert bucket_cap_bytes(0) == 0.0 and isinstance(bucket_cap_bytes(0), float)


def test_mib_become_bytes_in_one_module_only():
    converting = sorted(p.name for p in DP.glob("*.py") if "2 ** 20" in p.read_text())
    assert converting == ["buckets.py"], converting


@pytest.mark.parametrize("bad", [-1, -1e-9, float("nan"), float("inf"), True, "25", None])
def test_every_entry_point_refuses_a_bad_cap_the_same_way_before_any_rank_starts(no_ranks, bad):
    with pytest.raises(ValueError, match="bucket_cap_mb") as want:
        bucket_cap_bytes(bad)
    assert repr(bad) in str(want.value)                     # names what the user passed
    entries = {
        "predict_ddp": lambda: predict_ddp([[400, 40]] * 2, 1e-3, 1e-3, LINK, 2, bad),
        "bucket_curve": lambda: bucket_curve([0.5, bad], measure=False),
        "measure_ddp": lambda: measure_ddp(bucket_cap_mb=bad),
        "check_overlap": lambda: check_overlap(bucket_cap_mb=bad),
        "pytorch_overlap": lambda: pytorch_overlap(bucket_cap_mb=bad),
    }
    for name, call in entries.items():
        with pytest.raises(ValueError) as got:
            call()
        assert str(got.value) == str(want.value), name


# --- one bucketing rule: the wrapper's buckets are the prediction's --------------------------

SIZES = [(8, 16), (16, 4), (4, 4), (4, 24)]                 # uneven layers: the rule matters
CAPS = [0.0, 50 / 2 ** 20, 100 / 2 ** 20, 600 / 2 ** 20, 25.0]


def _wrapper_buckets(caps: list[float]) -> list[list[int]]:
    """Bytes per bucket of ``OverlappedDDP``, in reduce order, for each cap (built on a rank)."""
    from torch import nn

    from mtb_helpers.dp.overlap import OverlappedDDP
    out = []
    for cap in caps:
        ddp = OverlappedDDP(nn.Sequential(*(nn.Linear(a, b) for a, b in SIZES)), bucket_cap_mb=cap)
        size = {n: p.numel() * p.element_size() for n, p in ddp.module.named_parameters()}
        out.append([sum(size[n] for n in bucket) for bucket in ddp.buckets])
    return out


def test_the_wrapper_and_the_prediction_cut_the_same_buckets():
    from mtb_helpers import run
    layer_bytes = [[a * b * 4, b * 4] for a, b in SIZES]
    predicted = []
    for cap in CAPS:
        pred = predict_ddp(layer_bytes, 1e-3, 1e-3, LINK, 2, cap, overlap=True)
        predicted.append([e[4] for e in pred.events if e[1].startswith("all-reduce bucket")])
    wrapper = run(_wrapper_buckets, CAPS, world_size=2)[0]
    assert wrapper == predicted
    assert [len(b) for b in predicted] == [8, 6, 3, 2, 1]   # every cap cuts differently
    curve = bucket_curve(CAPS, measure=False, layers=4, hidden=16)
    assert curve["buckets"] == [8, 8, 4, 4, 1]               # 16 x 16 layers: 1024 + 64 B each
