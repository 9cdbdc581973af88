"""check_data_parallel: every strategy matches one process at several world sizes, bytes held and
sent equal the accounting, every bug fails exactly the quantities it breaks, bad input is refused
before any rank starts."""
from __future__ import annotations

import json

import pytest
import torch

from mtb_helpers import BUGS
from mtb_helpers.dp.bugs import BUGS as DP_REGISTRY
from mtb_helpers.dp.check import QUANTITIES, check_all_strategies, check_data_parallel
from mtb_helpers.dp.strategies import STRATEGIES
from mtb_helpers.dp.bugs import BUGS_BY_STRATEGY, DP_BUGS


def test_every_dp_bug_is_listed():
    assert set(DP_BUGS) <= set(BUGS) and all(BUGS[b] for b in DP_BUGS)
    assert "dp-grads-not-cleared" in DP_BUGS and BUGS_BY_STRATEGY["ddp"][-1] == "dp-grads-not-cleared"
    assert all(DP_REGISTRY[b].checks == ("data_parallel",) for b in DP_BUGS)
    # the rest of dp's registry: PyTorch's comparison and notebook 14's wrappers
    from mtb_helpers.dp.bugs import OVERLAP_BUGS
    assert set(DP_REGISTRY) - set(DP_BUGS) == {"no-ddp-wrapper", "fsdp-sum-not-average", *OVERLAP_BUGS}


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("t", [1, 2, 3, 4])
def test_one_step_equals_one_process_and_the_accounting(strategy, t):
    # hidden=5, ffn=7: 82 parameters (units 42 and 40), so t = 3 and 4 need padding
    report = check_data_parallel(world_size=t, strategy=strategy, batch=12, hidden=5, ffn_hidden=7)
    assert report.passed, str(report)
    assert {(r.quantity, r.rank) for r in report.rows} == {(q, r) for q in QUANTITIES for r in range(t)}
    mem, comm = report.extra["memory"], report.extra["communication"]
    assert mem["numel"] == 82
    for held in mem["per_rank"]:
        assert {k: held[k] for k in mem["ours"]} == mem["ours"]
    assert [c["total"] for c in comm["per_rank"]] == [comm["formula"]] * t
    d, pad = 4, mem["padded_numel"]
    expected_sent = {"ddp": 2 * (t - 1) * d * 82 // t, "zero1": 2 * (t - 1) * d * pad // t,
                     "zero2": 2 * (t - 1) * d * pad // t, "zero3": 3 * (t - 1) * d * pad // t}
    assert comm["formula"] == expected_sent[strategy]


def test_memory_shrinks_stage_by_stage_as_the_zero_paper_says():
    reports = check_all_strategies(world_size=4, batch=8, hidden=8, ffn_hidden=32)
    psi = 552   # 8*32 + 32 + 32*8 + 8, divisible by 4: no padding
    totals = {r.config["strategy"]: r.extra["memory"]["per_rank"][3] for r in reports}
    assert totals["ddp"] == {"params": 4 * psi, "grads": 4 * psi, "optimizer_state": 8 * psi}
    assert totals["zero1"] == {"params": 4 * psi, "grads": 4 * psi, "optimizer_state": 2 * psi}
    assert totals["zero2"] == {"params": 4 * psi, "grads": psi, "optimizer_state": 2 * psi}
    assert totals["zero3"]["params"] == psi and totals["zero3"]["gathered_transient"] == 4 * (8 * 32 + 32)
    paper = {r.config["strategy"]: r.extra["memory"]["paper_mixed_precision"] for r in reports}
    assert paper["zero2"] == {"params": 2 * psi, "grads": 2 * psi // 4, "optimizer_state": 12 * psi // 4}
    sent = {r.config["strategy"]: r.extra["communication"]["per_rank"][0] for r in reports}
    assert sent["zero1"]["total"] == sent["ddp"]["total"] == 2 * 3 * 4 * psi // 4
    assert set(sent["zero3"]["by_op"]) == {"forward all_gather", "backward all_gather",
                                           "backward reduce_scatter"}
    assert sent["zero2"]["by_op"]["step all_gather"] == 3 * 4 * psi // 4


def _expected(bug: str, t: int, steps: int = 3) -> set[tuple[str, int, str]]:
    every = {(q, r) for q in QUANTITIES for r in range(t)}
    if bug in ("dp-double-average", "dp-sum-not-average"):
        # the gradient is t times off; Adam's m and v follow it, and since the step starts from
        # a warm state (not Adam's scale-blind first step) so do the parameters, at every step
        failing = {k: every for k in range(1, steps + 1)}
    elif bug == "zero-stale-params":
        # step 1: grads and Adam's state are right, every rank's copy misses the other ranks'
        # shards; from step 2 on the stale copy computes wrong gradients, so everything fails
        failing = {1: {("params", r) for r in range(t)}, **{k: every for k in range(2, steps + 1)}}
    elif bug == "dp-grads-not-cleared":
        # step 1 is right (nothing to add to yet); step k uses g1 + ... + gk
        failing = {k: every for k in range(2, steps + 1)}
    else:
        raise AssertionError(bug)
    return {(q, r, f"step {k}") for k, pairs in failing.items() for q, r in pairs}


@pytest.mark.parametrize("t", [2, 3])
@pytest.mark.parametrize("strategy, bug", [(s, b) for s in STRATEGIES for b in BUGS_BY_STRATEGY[s]])
def test_bug_fails_exactly_the_quantities_it_breaks(strategy, bug, t):
    report = check_data_parallel(world_size=t, strategy=strategy, batch=6, bug=bug)
    failed = {(r.quantity, r.rank, r.note) for r in report.failed()}
    assert failed == _expected(bug, t), str(report)
    assert report.config["bug"] == bug


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero3"])
def test_one_step_cannot_see_uncleared_gradients_three_can(strategy):
    one = check_data_parallel(world_size=2, strategy=strategy, bug="dp-grads-not-cleared", steps=1)
    assert one.passed
    three = check_data_parallel(world_size=2, strategy=strategy, bug="dp-grads-not-cleared")
    assert three.config["steps"] == 3 and not three.passed
    assert {r.note for r in three.failed()} == {"step 2", "step 3"}


def test_every_step_is_compared_and_zero2_frees_its_grads_so_never_accumulates():
    report = check_data_parallel(world_size=2, strategy="zero2", dtype="float64", steps=4)
    assert report.passed and len(report.rows) == 4 * len(QUANTITIES) * 2
    assert [r.note for r in report.rows[::len(QUANTITIES) * 2]] == [f"step {k}" for k in range(1, 5)]
    assert "dp-grads-not-cleared" not in BUGS_BY_STRATEGY["zero2"]


def test_with_one_rank_no_communication_bug_has_anything_to_break():
    for strategy in STRATEGIES:
        for bug in BUGS_BY_STRATEGY[strategy]:
            report = check_data_parallel(world_size=1, strategy=strategy, bug=bug)
            # uncleared gradients are wrong with or without other ranks
            assert report.passed == (bug != "dp-grads-not-cleared"), (strategy, bug)


def test_stale_params_skips_the_all_gather_in_the_record():
    report = check_data_parallel(world_size=2, strategy="zero2", bug="zero-stale-params")
    assert report.records[0].count("all_gather") == 0
    comm = report.extra["communication"]
    assert comm["per_rank"][0]["total"] == comm["formula"] // 2


def test_report_is_strict_json_with_memory_and_communication():
    report = check_data_parallel(world_size=2, strategy="zero3", dtype="float64", seed=3)
    data = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert data["passed"] is True and data["config"]["strategy"] == "zero3"
    assert data["memory"]["dtype_bytes"] == 8 and data["memory"]["ours"]["params"] == 8 * 552 // 2
    assert data["communication"]["formula"] == 3 * 8 * 552 // 2
    assert max(r["max_abs_err"] for r in data["rows"]) < 1e-12
    assert "step" not in str(report.records[0].summary()) and "forward: 2 all_gather" in str(report)


def test_all_strategies_inject_a_bug_only_where_it_applies():
    reports = check_all_strategies(world_size=2, bug="zero-stale-params")
    assert {r.config["strategy"]: r.config["bug"] for r in reports} == {
        "ddp": None, "zero1": "zero-stale-params", "zero2": "zero-stale-params", "zero3": None}
    assert [r.passed for r in reports] == [True, False, False, True]


@pytest.mark.parametrize("call, message", [
    (lambda: check_data_parallel(world_size=3, batch=8), r"batch=8 is not divisible by the world size 3"),
    (lambda: check_data_parallel(strategy="fsdp"), r"unknown strategy 'fsdp'"),
    (lambda: check_data_parallel(hidden=0), r"hidden must be a positive integer"),
    (lambda: check_data_parallel(steps=0), r"steps must be a positive integer"),
    (lambda: check_data_parallel(lr=-1), r"lr must be a non-negative number"),
    (lambda: check_data_parallel(world_size=0), r"world.size"),
    (lambda: check_data_parallel(dtype=torch.float16), r"dtype"),
    (lambda: check_data_parallel(bug="no-such-bug"), r"unknown bug"),
    (lambda: check_data_parallel(bug="f-backward-identity"), r"does not apply"),
    (lambda: check_data_parallel(strategy="ddp", bug="zero-stale-params"),
     r"needs strategy in \('zero1', 'zero2'\) \(given strategy='ddp'\)"),
    (lambda: check_all_strategies(strategies=("ddp", "zero3"), bug="zero-stale-params"),
     r"does not apply to any of ddp, zero3; it applies to zero1, zero2"),
    (lambda: check_all_strategies(world_size=4, batch=6), r"batch=6 is not divisible"),
])
def test_bad_input_is_refused_before_any_rank_starts(no_ranks, call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_where_a_bug_applies_is_its_need_and_nothing_else(no_ranks):
    """Bug.needs is the one rule: the table notebook 06 prints is read from it, it agrees with the
    classes each bug replaces, and the checks refuse exactly where it is unmet."""
    from mtb_helpers.checking.bug import swap
    from mtb_helpers.dp import ShardedOptimizer
    from mtb_helpers.dp.fsdp import STRATEGY_CLASSES
    for s, cls in STRATEGY_CLASSES.items():
        built = (cls, ShardedOptimizer) if s in ("zero1", "zero2") else (cls,)   # what build_strategy swaps
        for name in DP_BUGS:
            bug = DP_REGISTRY[name]
            applies = not bug.unmet(strategy=s)
            replaced = any(swap(bug, c) is not c for c in built)
            assert (name in BUGS_BY_STRATEGY[s]) == applies == replaced, (s, name)
            if not applies:
                with pytest.raises(ValueError, match=f"needs strategy in .*given strategy='{s}'"):
                    check_data_parallel(strategy=s, bug=name)
    assert BUGS_BY_STRATEGY == {"ddp": ("dp-double-average", "dp-sum-not-average", "dp-grads-not-cleared"),
                                "zero1": DP_BUGS,
                                "zero2": ("dp-double-average", "dp-sum-not-average", "zero-stale-params"),
                                "zero3": ("dp-double-average", "dp-sum-not-average", "dp-grads-not-cleared")}


def test_a_strategy_changing_its_model_in_place_cannot_change_the_next_calls_problem(monkeypatch):
    """The one-process reference is cached per problem; under torchrun a strategy runs in the
    caller's process and gets the model and start state themselves, so the check hands it copies."""
    import mtb_helpers.dp.check as dp_check

    real_run = dp_check.run

    def careless_run(fn, strategy, model, start, *args, **kwargs):
        for p in model.parameters():          # what a careless strategy might do in place
            p.data.zero_()
        start["params"].add_(1.0)
        return real_run(fn, strategy, model, start, *args, **kwargs)

    monkeypatch.setattr(dp_check, "run", careless_run)
    check_data_parallel(world_size=2, strategy="ddp", seed=11)
    monkeypatch.setattr(dp_check, "run", real_run)
    assert check_data_parallel(world_size=2, strategy="ddp", seed=11).passed
