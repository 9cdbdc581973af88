"""``check_overlap`` passes for the correct wrappers and catches each deliberate bug, on exactly
the quantities it breaks; bad arguments are refused before any rank starts."""
from __future__ import annotations

import pytest
import torch

from mtb_helpers import BUGS
from mtb_helpers.check import check_overlap
from mtb_helpers.checking.bug import names_for
from mtb_helpers.dp.bugs import BUGS as DP_BUGS, OVERLAP, OVERLAP_BUGS

FP16 = {"compute_dtype": torch.float16, "reduce_dtype": torch.float32}
BREAKS = {
    "ddp-bucket-too-early": ("ddp", {}, {"params", "grads"}),
    "ddp-no-wait": ("ddp", {}, {"params", "grads"}),
    "ddp-double-average": ("ddp", {}, {"params", "grads"}),
    "ddp-no-sync-communicates": ("ddp", {}, {"no_sync all-reduces"}),
    "zero1-no-broadcast": ("zero1", {}, {"params"}),
    "fsdp-prefetch-wrong-module": ("fsdp", {}, {"on-demand all-gathers", "all-gathers"}),
    "fsdp-fp16-reduce": ("fsdp", FP16, {"params", "grads"}),
}


def test_every_overlap_bug_is_in_the_course_registry_and_tested_here():
    assert set(OVERLAP_BUGS) == set(BREAKS) and set(OVERLAP_BUGS) <= set(BUGS)


@pytest.mark.parametrize("wrapper, kwargs", [
    ("ddp", {}), ("zero1", {}), ("fsdp", {}), ("fsdp", {"prefetch": False}),
    ("fsdp", FP16), ("fsdp", {"compute_dtype": torch.bfloat16, "reduce_dtype": torch.float32}),
    ("ddp", {"world_size": 3, "dtype": torch.float32, "bucket_cap_mb": 0.0}),
])
def test_the_correct_wrappers_pass(wrapper, kwargs):
    report = check_overlap(wrapper=wrapper, **kwargs)
    assert report.passed, report.failure_lines()
    steps = {row.note.split(";")[0] for row in report.rows}
    assert steps == {"step 1", "step 2", "step 3"}
    if wrapper == "zero1":
        held = report.extra["state_bytes"]
        assert sum(held["per_rank"]) == held["unsharded"]
        assert max(held["per_rank"]) <= 0.6 * held["unsharded"]


@pytest.mark.parametrize("bug", sorted(BREAKS))
def test_each_bug_fails_exactly_what_it_breaks(bug):
    wrapper, kwargs, broken = BREAKS[bug]
    report = check_overlap(wrapper=wrapper, bug=bug, **kwargs)
    assert set(report.failing()) == broken, report.failure_lines()
    assert bug in names_for(DP_BUGS, OVERLAP, wrapper=wrapper)   # its needs: the wrapper it breaks


@pytest.mark.parametrize("kwargs, words", [
    ({"wrapper": "hsdp"}, "unknown wrapper"),
    ({"batch": 7}, "not divisible"),
    ({"steps": 0}, "steps"),
    ({"bucket_cap_mb": -1.0}, "bucket_cap_mb"),
    ({"bucket_cap_mb": float("nan")}, "bucket_cap_mb"),
    ({"wrapper": "fsdp", "compute_dtype": torch.int8}, "compute_dtype"),
    ({"wrapper": "ddp", "compute_dtype": torch.bfloat16}, "FSDP's"),
    ({"bug": "no-such-bug"}, "unknown bug"),
    ({"wrapper": "ddp", "bug": "zero1-no-broadcast"}, "needs wrapper='zero1'"),
    ({"wrapper": "fsdp", "bug": "fsdp-fp16-reduce"}, "float16"),
    ({"world_size": 99}, "world_size"),
])
def test_bad_arguments_are_refused_before_any_rank_starts(no_ranks, kwargs, words):
    with pytest.raises(ValueError, match=words):
        check_overlap(**kwargs)
