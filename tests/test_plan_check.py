"""The planner against real ranks: the capstone's bytes held per rank and the SP block's saved
activations equal the planner's formulas exactly; each deliberate bug turns its rows red."""
from __future__ import annotations

import pytest
import torch

from mtb_helpers.check import check_plan
from mtb_helpers.plan import Layout, stage_params, tiny_gpt
from mtb_helpers.plan.bugs import BUGS


@pytest.mark.parametrize("tp,pp,dp,cp,strategy", [
    (2, 2, 2, 1, "zero1"),     # 8 ranks: TP shards, two stages, sharded Adam
    (1, 2, 3, 1, "zero1"),     # stage 0 holds 18112 parameters: ZeRO-1 pads them to 18114
    (2, 1, 1, 2, "ddp"),       # context parallel: gradients averaged over dp x cp
])
def test_planner_equals_bytes_held_on_real_ranks(tp, pp, dp, cp, strategy):
    report = check_plan(tp=tp, pp=pp, dp=dp, cp=cp, strategy=strategy)
    assert report.passed, report.table()
    assert len(report.rows) == 3 * tp * pp * dp * cp + 2
    held = report.extra["held"]
    layout = Layout(tp, pp, dp, cp)
    stages = [stage_params(tiny_gpt(), layout, (r // (tp * cp * dp)))["dense"]
              for r in range(tp * pp * dp * cp)]
    assert held["params"] == stages
    assert held["measured"] == held["planner"]


def test_padding_is_real():
    report = check_plan(tp=1, pp=2, dp=3, strategy="zero1")
    assert report.extra["held"]["params"][0] == 18112
    assert report.extra["held"]["measured"][0]["parameters"] == 18114 * 8


def test_activation_rows_are_the_sp_notebooks_measurement():
    report = check_plan(tp=2, pp=1, dp=1, strategy="ddp", dtype=torch.float32)
    acts = report.extra["activations"]
    s, b, h, f, t = 8, 2, 8, 32, 2
    assert acts["tp"]["measured"] == 4 * s * b * h * 2 + 2 * 4 * s * b * f / t + s * b * h
    assert acts["sp_regather"]["measured"] == (4 * s * b * h * 2 + 2 * 4 * s * b * f + s * b * h) / t
    assert report.passed


@pytest.mark.parametrize("bug,broken", [
    ("plan-zero1-shards-gradients", {"gradients"}),
    ("plan-norms-split-by-tp", {"parameters", "gradients", "optimizer states"}),
    ("plan-sp-layernorm-input-whole", {"activations SP"}),
])
def test_each_bug_fails_exactly_its_rows(bug, broken):
    report = check_plan(tp=2, pp=1, dp=2, strategy="zero1", bug=bug)
    assert not report.passed
    assert set(report.failing()) == broken
    assert set(BUGS) == {"plan-zero1-shards-gradients", "plan-norms-split-by-tp",
                         "plan-sp-layernorm-input-whole"}


@pytest.mark.parametrize("kwargs,match", [
    (dict(strategy="zero3"), "strategy"),
    (dict(bug="no-such-bug"), "no-such-bug"),
    (dict(tp=3, pp=1, dp=1), "tp=3"),
    (dict(tp=2, pp=2, dp=4), "ranks"),
    (dict(dtype=torch.float16), "dtype"),
])
def test_bad_input_is_refused_before_any_rank_starts(no_ranks, kwargs, match):
    with pytest.raises(ValueError, match=match):
        check_plan(**kwargs)
