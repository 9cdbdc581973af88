"""The grid's pure layout, its groups on real ranks, the figures and the explorer."""
from __future__ import annotations

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from mtb_helpers import run  # noqa: E402
from mtb_helpers.grid.check import check_grid  # noqa: E402
from mtb_helpers.comm.mesh import Mesh  # noqa: E402
from mtb_helpers.grid.layers import (DP_REGION, dp_group_ranks, expected_bytes, make_groups,  # noqa: E402
                              param_piece, tp_group_ranks, validate_grid, destroy_groups)
from mtb_helpers.grid.plots import grid_bytes, group_lines, plot_grid, plot_grid_bytes  # noqa: E402
from mtb_helpers.plots.errors import plot_errors  # noqa: E402
from mtb_helpers.grid.widget import grid_choices, grid_explorer, grid_summary  # noqa: E402


def test_megatron_layout_tp_ranks_are_neighbours():
    assert tp_group_ranks(2, 2) == [[0, 1], [2, 3]]
    assert dp_group_ranks(2, 2) == [[0, 2], [1, 3]]
    assert tp_group_ranks(4, 1) == [[0, 1, 2, 3]] and dp_group_ranks(4, 1) == [[0], [1], [2], [3]]
    assert tp_group_ranks(1, 4) == [[0], [1], [2], [3]] and dp_group_ranks(1, 4) == [[0, 1, 2, 3]]
    assert tp_group_ranks(2, 3) == [[0, 1], [2, 3], [4, 5]]
    assert dp_group_ranks(2, 3) == [[0, 2, 4], [1, 3, 5]]
    for tp, dp in [(2, 2), (1, 4), (4, 1), (2, 3), (3, 2)]:
        mesh = Mesh(dp=dp, tp=tp)
        for rank in range(tp * dp):
            d, j = mesh.coords(rank)["dp"], mesh.coords(rank)["tp"]
            assert mesh.rank_of(dp=d, tp=j) == rank
            assert rank in tp_group_ranks(tp, dp)[d] and rank in dp_group_ranks(tp, dp)[j]
        # every rank in exactly one TP group and one DP group
        for groups in (tp_group_ranks(tp, dp), dp_group_ranks(tp, dp)):
            assert sorted(r for g in groups for r in g) == list(range(tp * dp))


@pytest.mark.parametrize("world_size, tp, dp", [(4, 3, 1), (4, 2, 1), (4, 0, 4), (4, 2, "2"),
                                                (4, True, 4)])
def test_a_grid_that_does_not_fit_is_refused(world_size, tp, dp):
    with pytest.raises(ValueError, match="tp|dp"):
        validate_grid(world_size, tp, dp)


def test_param_piece_and_expected_bytes():
    w1, w2 = torch.arange(32.).reshape(8, 4), torch.arange(32.).reshape(4, 8)
    assert torch.equal(param_piece("fc1.weight", w1, 2, 1), w1[4:])
    assert torch.equal(param_piece("fc2.weight", w2, 2, 1), w2[:, 4:])
    assert torch.equal(param_piece("fc1.bias", torch.arange(8.), 4, 3), torch.tensor([6., 7.]))
    assert torch.equal(param_piece("fc2.bias", torch.arange(4.), 2, 1), torch.arange(4.))
    e = expected_bytes(tp=2, dp=2, batch=8, hidden=8, ffn_hidden=16, itemsize=4)
    assert e["tp"] == {"all_reduces": 2, "bytes": 2 * 4 * 8 * 4, "sent": 2 * 4 * 8 * 4}
    assert e["dp"]["bytes"] == (8 * 8 + 8 + 8 * 8 + 8) * 4 and e["dp"]["all_reduces"] == 4
    one = expected_bytes(tp=4, dp=1, batch=8, hidden=8, ffn_hidden=16, itemsize=8)
    assert one["dp"]["sent"] == 0 and one["tp"]["sent"] == 2 * (3 * 8 * 8 * 8 * 2 // 4)


def _groups_on_rank(tp, dp):
    import torch.distributed as dist

    groups = make_groups(tp, dp)
    try:
        # an all-reduce of the rank in each group proves the members really talk to each other
        t = torch.tensor([float(dist.get_rank())])
        d = t.clone()
        dist.all_reduce(t, group=groups.tp_group)
        dist.all_reduce(d, group=groups.dp_group)
        return groups.tp_ranks, groups.dp_ranks, float(t), float(d)
    finally:
        destroy_groups(groups)


@pytest.mark.parametrize("tp, dp", [(2, 2), (1, 4), (4, 1)])
def test_groups_on_real_ranks(tp, dp):
    for rank, (tp_ranks, dp_ranks, tp_sum, dp_sum) in enumerate(
            run(_groups_on_rank, tp, dp, world_size=4)):
        d, j = Mesh(dp=dp, tp=tp).coords(rank).values()
        assert tp_ranks == tp_group_ranks(tp, dp)[d] and dp_ranks == dp_group_ranks(tp, dp)[j]
        assert tp_sum == sum(tp_ranks) and dp_sum == sum(dp_ranks)


def test_grid_figure_names_each_group_and_flags_the_wrong_one():
    good = check_grid()
    lines = [text for text, ok in group_lines(good)]
    assert all(ok for _, ok in group_lines(good))
    assert lines[0] == "TP group 0: ranks [0, 1]"
    assert "2 x all-reduce (g fwd, f bwd): 256 B in, 256 B sent/rank" in lines[1]
    assert any("DP group 1: ranks [1, 3]" == t for t in lines)
    assert any("4 x grad all-reduce: 576 B in, 576 B sent/rank" in t for t in lines)
    wrong = check_grid(bug="grid-dp-allreduce-in-tp-group")
    bad = [text for text, ok in group_lines(wrong) if not ok]
    assert len(bad) == 4 and sum("WRONG GROUP" in t for t in bad) == 2   # 2 TP groups + 2 empty DP
    missing = check_grid(bug="grid-no-dp-allreduce")
    assert [t for t, ok in group_lines(missing) if not ok] == ["  nothing", "  nothing"]
    drawn = grid_bytes(good)   # what plot_grid_bytes stacks: measured equals the formula per rank
    assert drawn["per_rank"] == drawn["formula"] == [{"tp": 256, "dp": 576}] * 4
    assert grid_bytes(missing)["per_rank"][0] == {"tp": 256, "dp": 0}
    for report in (good, wrong):
        for fig in (plot_grid(report), plot_grid_bytes(report),
                    plot_errors(report, by="quantity")):
            titles = [ax.get_title() for ax in fig.axes] + [fig._suptitle.get_text()
                                                            if fig._suptitle else ""]
            assert any("dp=2" in t or "tp_x_dp" in t for t in titles), titles
            plt.close(fig)
    fig = plot_grid(wrong)
    assert "FAILED" in fig._suptitle.get_text()
    plt.close(fig)


def _shown(explorer) -> str:
    """The texts the explorer shows now (the shared frame's HTML widgets, below the controls)."""
    import html
    return "\n".join(html.unescape(w.value) for w in explorer.children[-1].children
                     if isinstance(getattr(w, "value", None), str))


def test_explorer_choices_summary_and_redraw():
    assert grid_choices(4) == [("tp=1 x dp=4", (1, 4)), ("tp=2 x dp=2", (2, 2)),
                               ("tp=4 x dp=1", (4, 1))]
    report = check_grid(tp=4, dp=1)
    assert grid_summary(report).startswith("PASS: tp=4 x dp=1")
    assert "ranks [0, 1, 2, 3] (768 B sent)" in grid_summary(report)
    explorer = grid_explorer(4)
    assert "PASS: tp=2 x dp=2" in _shown(explorer)
    shape, dtype, bug = explorer.children[0].children
    shape.value = "tp=1 x dp=4"
    assert "PASS: tp=1 x dp=4" in _shown(explorer)
    bug.value = "grid-no-dp-allreduce"
    assert "FAIL (fc1.weight_grad" in _shown(explorer)
    plt.close("all")


@pytest.mark.parametrize("tp, dp", [(2, 2), (1, 4), (4, 1)])
def test_the_dp_all_reduce_of_each_shard_is_in_the_record_even_with_one_replica(tp, dp):
    # fc1 [ffn/tp, h], [ffn/tp]; fc2 [h, ffn/tp], [h]: one all-reduce each over the dp group,
    # ring bytes 2 (dp-1)/dp N; with one replica nothing moves and it is still recorded
    report = check_grid(tp=tp, dp=dp, hidden=8, ffn_hidden=16, batch=8, dtype="float64")
    shards = [(16 // tp, 8), (16 // tp,), (8, 16 // tp), (8,)]
    sizes = [8 * (s[0] * s[1] if len(s) == 2 else s[0]) for s in shards]
    for rec in report.records:
        got = [(e.op, e.operator, e.direction, e.shape, e.out_shape, e.bytes, e.sent_bytes,
                e.group_size) for e in rec.select(region=DP_REGION)]
        assert got == [("all_reduce", "", "backward", s, s, n, 2 * (dp - 1) * n // dp, dp)
                       for s, n in zip(shards, sizes)]
