"""check_grid: one SGD step on a tp x dp grid equals one process; every bug fails exactly the
quantities it breaks (which depend on the grid); the record shows each group's collectives;
bad input is refused before any rank starts."""
from __future__ import annotations

import json

import pytest

from mtb_helpers import BUGS
from mtb_helpers.grid.check import GRID_BUGS, GRID_QUANTITIES, check_grid
from mtb_helpers.grid.layers import DP_REGION

GRADS_AND_PARAMS = set(GRID_QUANTITIES) - {"output"}
SHARDED = {q for q in GRADS_AND_PARAMS if not q.startswith("fc2.bias")}

# (tp, dp, bug) -> the quantities that must fail, on every rank. One step, so the forward output
# is never touched; with dp = 1 there is no other replica, so forgetting or not averaging the DP
# all-reduce changes nothing, but summing a TP group still mixes different shards (fc2's bias
# is replicated in the TP group, so its average there is itself: right only when dp = 1).
BROKEN = [
    (2, 2, "grid-dp-allreduce-in-tp-group", GRADS_AND_PARAMS),
    (2, 2, "grid-no-dp-allreduce", GRADS_AND_PARAMS),
    (2, 2, "grid-dp-sum-not-average", GRADS_AND_PARAMS),
    (1, 4, "grid-dp-allreduce-in-tp-group", GRADS_AND_PARAMS),
    (1, 4, "grid-no-dp-allreduce", GRADS_AND_PARAMS),
    (1, 4, "grid-dp-sum-not-average", GRADS_AND_PARAMS),
    (4, 1, "grid-dp-allreduce-in-tp-group", SHARDED),
    (4, 1, "grid-no-dp-allreduce", set()),
    (4, 1, "grid-dp-sum-not-average", set()),
]


def test_every_grid_bug_is_listed_and_tested():
    assert set(GRID_BUGS) <= set(BUGS)
    assert {bug for _, _, bug, _ in BROKEN} == set(GRID_BUGS)


@pytest.mark.parametrize("tp, dp", [(2, 2), (1, 4), (4, 1)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_one_step_on_the_grid_equals_one_process(tp, dp, dtype):
    report = check_grid(tp=tp, dp=dp, dtype=dtype, seed=1)
    assert report.passed, str(report)
    assert report.quantities() == list(GRID_QUANTITIES)
    assert len(report.rows) == len(GRID_QUANTITIES) * 4
    assert report.config["tp"] == tp and report.config["dp"] == dp
    loss = report.extra["loss"]
    # replicas see different rows, so their losses differ; their mean is the batch loss
    per_replica = loss["per_rank"][::tp]
    assert sum(per_replica) / dp == pytest.approx(loss["reference"], rel=1e-5)


@pytest.mark.parametrize("tp, dp, bug, broken", BROKEN,
                         ids=[f"{tp}x{dp}-{bug}" for tp, dp, bug, _ in BROKEN])
def test_bug_fails_exactly_the_quantities_it_breaks(tp, dp, bug, broken):
    report = check_grid(tp=tp, dp=dp, bug=bug)
    failed = {(r.quantity, r.rank) for r in report.failed()}
    assert failed == {(q, rank) for q in broken for rank in range(4)}, str(report)
    assert report.passed == (not broken)
    assert report.config["bug"] == bug


def _groups_of(report, rank, region_is_dp):
    return {tuple(e["group_ranks"]) for e in report.extra["collectives"][rank]
            if (e["region"] == DP_REGION) == region_is_dp}


def test_record_shows_both_kinds_of_collective_with_their_groups():
    report = check_grid(tp=2, dp=2, hidden=8, ffn_hidden=16, batch=8)
    for rank in range(4):
        rec = report.records[rank]
        assert [(e.region, e.direction) for e in rec][:2] == [
            ("reduce_from_tensor_model_parallel_region", "forward"),
            ("copy_to_tensor_model_parallel_region", "backward")]
        dp_events = rec.select(region=DP_REGION)
        # one all-reduce per local parameter shard: fc1 [8, 8], [8]; fc2 [8, 8], [8]
        assert [e.shape for e in dp_events] == [(8, 8), (8,), (8, 8), (8,)]
        assert _groups_of(report, rank, False) == {(0, 1) if rank < 2 else (2, 3)}
        assert _groups_of(report, rank, True) == {(0, 2) if rank % 2 == 0 else (1, 3)}
        measured = {e["kind"]: e for e in report.extra["traffic"][rank]}
        for kind in ("tp", "dp"):
            expected = report.extra["expected_bytes"][kind]
            assert measured[kind]["sent"] == expected["sent"] > 0
            assert measured[kind]["all_reduces"] == expected["all_reduces"]
    data = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert data["grid"]["tp_groups"] == [[0, 1], [2, 3]] and data["grid"]["dp_groups"] == [[0, 2], [1, 3]]
    assert "dp_index * tp + tp_index" in data["grid"]["convention"]


def test_the_records_tell_the_bugs_apart():
    wrong = check_grid(bug="grid-dp-allreduce-in-tp-group")
    assert _groups_of(wrong, 0, True) == {(0, 1)} and _groups_of(wrong, 3, True) == {(2, 3)}
    none = check_grid(bug="grid-no-dp-allreduce")
    assert all(rec.count(region=DP_REGION) == 0 for rec in none.records)
    summed = check_grid(bug="grid-dp-sum-not-average")
    assert all(rec.count(region=DP_REGION) == 4 for rec in summed.records)
    # summing instead of averaging makes every gradient dp = 2 times too large: the error is
    # (dp - 1) times the gradient itself, a relative error of exactly 1
    for row in summed.rows:
        if row.quantity.endswith("_grad"):
            assert not row.passed and row.max_rel_err == pytest.approx(1.0, rel=1e-4)


@pytest.mark.parametrize("kwargs, match", [
    ({"tp": 2, "dp": 1}, "does not match the world size 4"),
    ({"tp": 3, "dp": 2}, "does not match the world size 4"),
    ({"tp": 0, "dp": 4}, "tp must be a positive integer"),
    ({"ffn_hidden": 10, "tp": 4, "dp": 1}, "ffn_hidden=10 is not divisible"),
    ({"batch": 6, "tp": 1, "dp": 4}, "batch=6 is not divisible by dp=4"),
    ({"batch": 0}, "batch must be a positive integer"),
    ({"lr": 0}, "lr must be a positive number"),
    ({"bug": "f-backward-identity"}, "does not apply"),
    ({"bug": "no-such-bug"}, "unknown bug"),
    ({"dtype": "float16"}, "dtype"),
    ({"world_size": 9}, "world_size"),
])
def test_bad_input_is_refused_before_any_rank_starts(no_ranks, kwargs, match):
    with pytest.raises(ValueError, match=match):
        check_grid(**kwargs)
