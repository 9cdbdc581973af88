"""Each lesson in PyTorch's own API agrees with the course's layer on the same ranks (float64),
issues the same collectives, and a wrong placement or setting is caught on what it breaks."""
from __future__ import annotations

import re

import pytest

import mtb_helpers.dp.pytorch as dp_api
import mtb_helpers.grid.pytorch as grid_api
import mtb_helpers.pp.pytorch as pp_api
import mtb_helpers.sp.pytorch as sp_api
import mtb_helpers.tp.pytorch as tp_api


def _same_counts(res, *, except_rows=()):
    for row, (theirs, ours) in res.counts.items():
        if row not in except_rows:
            assert theirs == ours, (row, str(res))


def _deterministic(res):
    """The summary (what a notebook checks) prints no raw floating-point error."""
    assert not re.search(r"\d\.\de[-+]\d", res.summary()), res.summary()


@pytest.mark.parametrize("t", [2, 3])
@pytest.mark.parametrize("compare, quantities", [
    (tp_api.pytorch_column, {"output", "input_grad", "weight_grad", "bias_grad"}),
    (tp_api.pytorch_row, {"output", "input_grad", "weight_grad", "bias_grad"}),
    (tp_api.pytorch_mlp, {"output", "input_grad", "fc1.weight_grad", "fc1.bias_grad",
                          "fc2.weight_grad", "fc2.bias_grad"}),
])
def test_tensor_parallel_plans_agree_with_the_course(compare, quantities, t):
    res = compare(world_size=t)
    assert res.agree, str(res)
    assert set(res.errors) == quantities
    assert res.world_size == t
    _same_counts(res)
    # one all-reduce in total per direction for the MLP; column: backward only; row: forward only
    total = {d: sum(p.get("all_reduce", 0) for p in (res.counts[d][0],))
             for d in ("forward", "backward")}
    expected = {tp_api.pytorch_column: {"forward": 0, "backward": 1},
                tp_api.pytorch_row: {"forward": 1, "backward": 0},
                tp_api.pytorch_mlp: {"forward": 1, "backward": 1}}[compare]
    assert total == expected
    _deterministic(res)


@pytest.mark.parametrize("compare, bug, broken", [
    (tp_api.pytorch_column, "input-as-partial", {"output", "weight_grad"}),
    (tp_api.pytorch_row, "row-output-partial", {"output"}),
    (tp_api.pytorch_mlp, "row-output-partial", {"output"}),
])
def test_a_wrong_placement_is_caught_on_what_it_breaks(compare, bug, broken):
    res = compare(world_size=2, bug=bug)
    assert not res.agree
    assert res.disagreeing() == broken, str(res)
    assert "DISAGREE" in res.summary()


@pytest.mark.parametrize("t", [2, 3])
def test_sequence_parallel_agrees_and_leaves_layernorm_grads_partial(t):
    res = sp_api.pytorch_sequence_parallel(world_size=t)
    assert res.agree, str(res)
    assert {"ln.weight_grad", "ln.bias_grad", "fc2.bias_grad"} <= set(res.errors)
    fwd_torch, fwd_course = res.counts["forward"]
    assert fwd_torch == fwd_course == {"all_gather": 1, "reduce_scatter": 1}
    bwd_torch, bwd_course = res.counts["backward"]
    assert bwd_torch == {"all_gather": 1, "reduce_scatter": 1}
    # the course all-reduces ln.weight, ln.bias and fc2.bias grads inside backward
    assert bwd_course.get("all_reduce") == 3
    # PyTorch leaves the LayerNorm grads Partial: reading them all-reduces two tensors
    assert res.counts["grads .full_tensor()"] == ({"all_reduce": 2}, {})
    assert any("Partial" in n for n in res.notes)
    _deterministic(res)


def test_layernorm_grads_read_as_partial_are_caught():
    res = sp_api.pytorch_sequence_parallel(world_size=2, bug="ln-grad-partial")
    assert res.disagreeing() == {"ln.weight_grad", "ln.bias_grad"}, str(res)


@pytest.mark.parametrize("t", [2, 3])
@pytest.mark.parametrize("strategy, forward, backward", [
    ("ddp", {}, {"all_reduce": 1}),
    ("fsdp", {"all_gather": 2}, {"all_gather": 2, "reduce_scatter": 2}),
])
def test_ddp_and_fsdp2_agree_with_the_course_over_three_adam_steps(strategy, forward, backward, t):
    res = dp_api.pytorch_data_parallel(world_size=t, strategy=strategy, steps=3)
    assert res.agree, str(res)
    assert set(res.errors) == {"params", "grads", "loss"}
    _same_counts(res)
    assert res.counts["forward"][0] == forward
    assert res.counts["backward"][0] == backward
    assert res.counts["step"][0] == {}
    _deterministic(res)


@pytest.mark.parametrize("strategy, bug", [("ddp", "no-ddp-wrapper"),
                                               ("fsdp", "fsdp-sum-not-average")])
def test_a_wrong_data_parallel_setup_is_caught(strategy, bug):
    res = dp_api.pytorch_data_parallel(world_size=2, strategy=strategy, bug=bug)
    assert {"params", "grads"} <= res.disagreeing(), str(res)


@pytest.mark.parametrize("world_size, tp, dp", [(4, 2, 2), (3, 3, 1), (3, 1, 3)])
def test_device_mesh_grid_agrees_with_the_course_grid(world_size, tp, dp):
    res = grid_api.pytorch_grid(world_size=world_size, tp=tp, dp=dp)
    assert res.agree, str(res)
    _same_counts(res)
    assert res.counts["grad sync (dp group)"][0] == ({"all_reduce": 4} if dp > 1 else {})
    assert res.counts["forward (tp group)"][0] == ({"all_reduce": 1} if tp > 1 else {})
    assert "the same groups as the course's: yes" in res.notes[0]
    _deterministic(res)


def test_device_mesh_dims_named_the_wrong_way_round_are_caught():
    res = grid_api.pytorch_grid(world_size=4, tp=2, dp=2, bug="mesh-dims-swapped")
    assert {"output", "loss", "fc1.weight_grad"} <= res.disagreeing(), str(res)
    assert "the same groups as the course's: NO" in res.notes[0]


@pytest.mark.parametrize("t", [2, 3])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipelining_schedules_match_one_process_and_the_course_order(schedule, t):
    res = pp_api.pytorch_pipeline(world_size=t, schedule=schedule, microbatches=4, batch=8)
    assert res.agree, str(res)
    assert res.errors["op order"] == 0
    _same_counts(res)
    # the middle stage talks to two neighbours: m activations and m grads each way
    if t == 3:
        assert res.counts["stage 1"][0] == {"send": 8, "recv": 8}
    _deterministic(res)


@pytest.mark.parametrize("bug, broken", [("scale-grads-off", {"weight_grad", "bias_grad"}),
                                             ("other-schedule", {"op order"})])
def test_a_wrong_pipeline_setup_is_caught(bug, broken):
    res = pp_api.pytorch_pipeline(world_size=3, schedule="1f1b", microbatches=4, batch=8,
                                  bug=bug)
    assert res.disagreeing() == broken, str(res)


@pytest.mark.parametrize("call, words", [
    (lambda: tp_api.pytorch_column(world_size=5), "out_features=12"),
    (lambda: tp_api.pytorch_row(world_size=5), "in_features=12"),
    (lambda: tp_api.pytorch_mlp(world_size=5), "ffn_hidden=12"),
    (lambda: tp_api.pytorch_column(bug="nope"), "unknown bug"),
    (lambda: sp_api.pytorch_sequence_parallel(world_size=5), "seq_len=12"),
    (lambda: dp_api.pytorch_data_parallel(world_size=4, batch=6), "batch=6"),
    (lambda: dp_api.pytorch_data_parallel(strategy="zero2"), "unknown strategy"),
    (lambda: grid_api.pytorch_grid(world_size=4, tp=3, dp=1), "tp=3 x dp=1"),
    (lambda: grid_api.pytorch_grid(world_size=4, tp=2, dp=2, batch=5), "batch=5"),
    (lambda: pp_api.pytorch_pipeline(world_size=2, batch=10, microbatches=4), "batch=10"),
    (lambda: pp_api.pytorch_pipeline(world_size=1), "at least 2 stages"),
    (lambda: pp_api.pytorch_pipeline(schedule="interleaved"), "unknown schedule"),
    (lambda: tp_api.pytorch_column(bug="row-output-partial"), "does not apply"),
    (lambda: tp_api.pytorch_row(bug="bias-before-allreduce"), "does not apply"),
    (lambda: dp_api.pytorch_data_parallel(strategy="fsdp", bug="no-ddp-wrapper"),
     "needs strategy='ddp'"),
])
def test_bad_input_is_refused_before_any_rank_starts(no_ranks, call, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        call()


def test_every_comparison_bug_is_a_registered_bug_that_overrides_one_piece():
    import pickle

    import mtb_helpers
    from mtb_helpers.checking.bug import registered
    comparisons = {"pytorch_column", "pytorch_row", "pytorch_mlp", "pytorch_sequence_parallel",
                   "pytorch_data_parallel", "pytorch_grid", "pytorch_pipeline"}
    found = {name: bug for name, bug in registered().items() if set(bug.checks) & comparisons}
    assert set(found) == {"input-as-partial", "row-output-partial", "ln-grad-partial",
                          "no-ddp-wrapper", "fsdp-sum-not-average", "mesh-dims-swapped",
                          "scale-grads-off", "other-schedule"}
    assert set(found) <= set(mtb_helpers.BUGS)
    for name, bug in found.items():
        (correct, wrong), = bug.replaces.items()
        assert wrong is not correct and wrong.__doc__.strip(".\n ") == name
        assert pickle.loads(pickle.dumps(bug)) is bug   # a Bug travels to the ranks as its name
