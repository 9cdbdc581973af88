"""check_moe: passes against one process at every world size; every bug fails exactly what it
breaks (derived from the routing the ranks report); bad input refused before ranks start."""
from __future__ import annotations

import json

import pytest
import torch

from mtb_helpers import BUGS
from mtb_helpers.moe.check import (EXPERT_PARAMS, all_gather_alternative_bytes, check_moe,
                                   make_moe_inputs)
from mtb_helpers.moe.bugs import MOE_BUGS


def _expert_rows(e: int, owner: int) -> set:
    return {(f"experts.{e}.{p}_grad", owner) for p in EXPERT_PARAMS}


def _failed(report) -> set:
    return {(r.quantity, r.rank) for r in report.failed()}


@pytest.mark.parametrize("t, k, cf, dtype", [(1, 1, None, "float32"), (2, 1, None, "float32"),
                                             (4, 2, None, "float64"), (2, 2, 1.0, "float32"),
                                             (4, 1, 0.5, "float32")])
def test_moe_matches_one_process(t, k, cf, dtype):
    report = check_moe(world_size=t, top_k=k, capacity_factor=cf, dtype=dtype, seed=1)
    assert report.passed, str(report)
    moe = report.extra["moe"]
    assert moe["matches_reference"]
    assert len(report.rows) == 3 * t + 4 * len(EXPERT_PARAMS)
    # every kept choice was dispatched: the rows each rank sends add up to its kept choices
    kept = torch.tensor(moe["kept"])
    n = report.config["tokens"] // t
    assert [sum(rows) for rows in moe["dispatch_rows"]] == [int(kept[r * n:(r + 1) * n].sum())
                                                            for r in range(t)]


def test_capacity_drops_tokens_and_the_reference_drops_the_same():
    free = check_moe(world_size=2, top_k=1)
    tight = check_moe(world_size=2, top_k=1, capacity_factor=1.0)
    assert free.passed and tight.passed
    assert sum(free.extra["moe"]["dropped_per_expert"]) == 0
    moe = tight.extra["moe"]
    assert moe["capacity"] == 2   # ceil(1.0 * 8 tokens * 1 choice / 4 experts)
    assert sum(moe["dropped_per_expert"]) > 0
    assert all(c <= moe["capacity"] for per_rank in moe["tokens_per_expert"] for c in per_rank)
    assert sum(map(sum, moe["tokens_per_expert"])) + sum(moe["dropped_per_expert"]) == 16


def test_bytes_come_from_the_record_and_match_the_split_sizes():
    report = check_moe(world_size=4, top_k=2)
    moe, t = report.extra["moe"], 4
    for r in range(t):
        rows_out = sum(moe["dispatch_rows"][r]) - moe["dispatch_rows"][r][r]
        assert moe["bytes"]["dispatch"][r] == rows_out * moe["row_bytes"]
        back = sum(moe["dispatch_rows"][q][r] for q in range(t) if q != r)
        assert moe["bytes"]["combine"][r] == back * moe["row_bytes"]
        assert moe["bytes"]["counts"][r] == (t - 1) * 1 * 8       # E/t int64 counts per peer
        assert report.records[r].count("all_to_all", "forward") == 3
        assert report.records[r].count("all_to_all", "backward") == 2
        assert report.records[r].count("all_reduce", "backward") == 1
    assert moe["bytes"]["all_gather_alternative"][0] == all_gather_alternative_bytes(16, 8, 4, 4)


def test_every_moe_bug_is_listed():
    assert set(MOE_BUGS) <= set(BUGS)


def _order_breaks(moe, t):
    """Per rank: the sorted positions p where the expert order moved a row (order[p] != p)."""
    moved = []
    for r in range(t):
        dest = torch.tensor(moe["dest_expert"][r], dtype=torch.long)
        order = torch.argsort(dest, stable=True)
        moved.append({int(dest[order[p]]) for p in range(len(order)) if order[p] != p})
    return moved


@pytest.mark.parametrize("t, k", [(1, 1), (2, 1), (2, 2), (4, 1)])
def test_no_inverse_permutation_fails_exactly_where_rows_moved(t, k):
    report = check_moe(world_size=t, top_k=k, bug="moe-no-inverse-permutation")
    moe = report.extra["moe"]
    moved = _order_breaks(moe, t)
    expected = set()
    for r in range(t):
        if moved[r]:
            expected |= {("output", r), ("input_grad", r)}
    if any(moved):
        expected |= {("gate.weight_grad", r) for r in range(t)}
    for e in set().union(*moved):
        expected |= _expert_rows(e, moe["owner"][e])
    assert expected and _failed(report) == expected, str(report)


@pytest.mark.parametrize("t, k, cf", [(2, 1, None), (2, 2, 0.5), (4, 1, None)])
def test_gate_not_applied_fails_everything_the_gate_touches(t, k, cf):
    report = check_moe(world_size=t, top_k=k, capacity_factor=cf, bug="moe-gate-not-applied")
    moe = report.extra["moe"]
    n = moe["tokens_per_rank"]
    kept = torch.tensor(moe["kept"])
    expected = {("gate.weight_grad", r) for r in range(t)}
    for r in range(t):
        if kept[r * n:(r + 1) * n].any():
            expected |= {("output", r), ("input_grad", r)}
    for e in range(4):
        if any(per_rank[e] for per_rank in moe["tokens_per_expert"]):
            expected |= _expert_rows(e, moe["owner"][e])
    assert _failed(report) == expected
    assert report.row("gate.weight_grad", 0).note == "not produced"
    assert all(rec.count("all_reduce") == 0 for rec in report.records)


@pytest.mark.parametrize("t", [2, 4])
def test_no_router_grad_allreduce_fails_only_the_router_grad(t):
    report = check_moe(world_size=t, bug="moe-no-router-grad-allreduce")
    assert _failed(report) == {("gate.weight_grad", r) for r in range(t)}
    assert all(rec.count("all_reduce") == 0 for rec in report.records)


def test_one_rank_has_no_router_grad_to_sum():
    assert check_moe(world_size=1, bug="moe-no-router-grad-allreduce").passed


def test_report_is_strict_json_and_readable():
    report = check_moe(world_size=2, top_k=2, capacity_factor=1.0, bug="moe-gate-not-applied")
    data = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert data["passed"] is False and data["config"]["capacity_factor"] == 1.0
    assert data["moe"]["owner"] == [0, 0, 1, 1] and len(data["moe"]["experts"]) == 16
    assert "experts.3.fc2.bias_grad" in str(report) and "all_to_all" in str(report)


@pytest.mark.parametrize("kwargs, message", [
    ({"world_size": 3}, "num_experts=4 is not divisible by the world size 3"),
    ({"top_k": 5}, "top_k=5 is more than num_experts=4"),
    ({"capacity_factor": 0}, "capacity_factor must be None or a number > 0"),
    ({"capacity_factor": -1.0}, "capacity_factor"),
    ({"tokens": 15}, "tokens=15 is not divisible by the world size 2"),
    ({"hidden": 0}, "hidden must be a positive integer"),
    ({"bug": "bias-before-allreduce"}, "does not apply"),
    ({"dtype": torch.float16}, "dtype"),
])
def test_bad_input_is_refused_before_ranks_start(kwargs, message, no_ranks):
    with pytest.raises(ValueError, match=message):
        check_moe(**kwargs)


def test_figures_have_titles_labels_legends_and_one_box_per_token():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mtb_helpers.moe.plots import (plot_all_to_all_bytes, plot_moe_errors, plot_routing,
                                       plot_tokens_per_expert)
    report = check_moe(world_size=2, top_k=2, capacity_factor=1.0, bug="moe-gate-not-applied")
    moe = report.extra["moe"]
    routing = plot_routing(moe)
    texts = [t.get_text() for t in routing.axes[0].texts]
    assert sum(s.startswith("token ") for s in texts) == 16
    assert sum(s.startswith("expert ") for s in texts) == 4 and "capacity 4" in routing.axes[0].get_title()
    tokens = plot_tokens_per_expert(moe)
    assert "dropped" in tokens.axes[0].get_title() and tokens.axes[0].get_legend() is not None
    heights = sum(p.get_height() for p in tokens.axes[0].patches)
    assert heights == 32   # every choice drawn once: kept + dropped = 16 tokens x 2
    by = plot_all_to_all_bytes(moe)
    assert len(by.axes) == 3 and by.legends and all(ax.get_xlabel() for ax in by.axes)
    errors = plot_moe_errors(report)
    ax = errors.axes[0]
    assert "FAILED" in ax.get_title() and ax.get_ylabel() and ax.get_legend() is not None
    assert [t.get_text() for t in ax.get_xticklabels()][:3] == ["output", "input_grad",
                                                               "gate.weight_grad"]
    plt.close("all")


def test_building_the_inputs_leaves_the_callers_random_stream_alone():
    from mtb_helpers.moe.check import make_moe_inputs

    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    first = make_moe_inputs(8, 4, 8, 4, seed=0)
    assert torch.equal(torch.rand(3), expected)
    again = make_moe_inputs(8, 4, 8, 4, seed=0)
    assert torch.equal(first[2], again[2])  # and the inputs still follow their own seed


@pytest.mark.parametrize("tokens, num_experts", [(16, 4), (8, 4)])
def test_the_notebooks_routing_has_no_near_tie_a_blas_could_flip(tokens, num_experts):
    """Notebook 07 prints which expert each token chose in compared cells. Another BLAS may move
    the router logits by an ulp (~1e-7 here); a choice is safe when the chosen logits beat the
    next ones by far more than that, for top-1 and top-2 alike."""
    gate, _, x, _ = make_moe_inputs(tokens=tokens, hidden=8, ffn_hidden=16,
                                    num_experts=num_experts, seed=0)
    logits = (x.double() @ gate.weight.double().T).sort(dim=-1, descending=True).values
    gaps = logits[:, :-1] - logits[:, 1:]          # first vs second, second vs third, ...
    assert gaps[:, :2].min() > 1e-4, gaps[:, :2].min()
