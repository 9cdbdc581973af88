"""The collectives primer: checks at world sizes 1-4, every deliberate bug caught, bad input
refused before any rank starts, the byte formulas and the measured bytes, figures and explorer."""
from __future__ import annotations

import json

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

import mtb_helpers.collectives.ops as coll  # noqa: E402
from mtb_helpers import BUGS, RankTimeoutError  # noqa: E402
import mtb_helpers.collectives.check as cc  # noqa: E402
from mtb_helpers.collectives.bugs import COLLECTIVE_BUGS  # noqa: E402
from mtb_helpers.collectives.ops import COLLECTIVES, formula_bytes, reference  # noqa: E402
from mtb_helpers.collectives.check import check_collectives  # noqa: E402


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_every_collective_matches_the_reference(world_size):
    numel = 2 * world_size
    report = check_collectives(world_size, numel=numel, seed=3)
    assert report.passed
    assert len(report.rows) == len(COLLECTIVES) * world_size
    assert [(r.quantity, r.rank) for r in report.rows] == [
        (v["collective"], v["rank"]) for v in report.extra["values"]]
    assert all(r.tolerance == 0.0 and r.max_abs_err == 0.0 for r in report.rows)
    for row in report.extra["values"]:
        inputs = [coll.rank_input(row["collective"], r, world_size, numel, seed=3)
                  for r in range(world_size)]
        assert row["before"] == inputs[row["rank"]].tolist()
        assert row["after"] == row["expected"]
        assert row["expected"] == reference(row["collective"], inputs)[row["rank"]].tolist()
        assert row["max_abs_error"] == 0.0
    # Provenance: all-gather slot j came from rank j; every all-reduce cell from every rank.
    for row in report.rows_for("all-gather"):
        assert row["sources"] == [[i // 2] for i in range(numel)]
    for row in report.rows_for("all-reduce"):
        assert row["sources"] == [list(range(world_size))] * numel
    json.dumps(report.to_dict())
    assert "PASSED" in str(report) and "<table" in report._repr_html_()


@pytest.mark.parametrize("bug", sorted(COLLECTIVE_BUGS))
def test_each_bug_is_caught_on_its_collective_only(bug):
    assert bug in BUGS
    report = check_collectives(3, numel=6, bug=bug)
    assert not report.passed
    assert set(report.failing()) == {COLLECTIVE_BUGS[bug]}
    assert {v["collective"] for v in report.extra["values"] if not v["passed"]} == {COLLECTIVE_BUGS[bug]}
    assert "FAILED" in str(report)


def test_bug_provenance_shows_where_values_came_from():
    report = check_collectives(3, numel=6, bug="broadcast-wrong-root", collectives=("broadcast",))
    assert all(row["sources"] == [[2]] * 6 for row in report.rows_for("broadcast"))
    report = check_collectives(2, numel=4, bug="allreduce-lost-inplace", collectives=("all-reduce",))
    assert [row["sources"] for row in report.rows_for("all-reduce")] == [[[0]] * 4, [[1]] * 4]


@pytest.mark.parametrize("kwargs, match", [
    ({"numel": 7}, "divisible"),
    ({"numel": 0}, "positive"),
    ({"world_size": 0}, "world_size"),
    ({"world_size": 9}, "world_size"),
    ({"world_size": 2.0}, "world_size"),
    ({"dtype": torch.int64}, "dtype"),
    ({"seed": -1}, "seed"),
    ({"bug": "no-such-bug"}, "unknown bug"),
    ({"bug": "bias-before-allreduce"}, "does not apply"),
    ({"bug": "allgather-rank-order", "collectives": ("broadcast",)}, "among the collectives checked"),
    ({"bug": "allgather-rank-order", "world_size": 1, "numel": 4}, "cannot show"),
    ({"bug": "alltoall-wrong-split", "numel": 2}, "cannot show"),
    ({"collectives": ("all-scatter",)}, "unknown collective"),
])
def test_bad_input_is_refused_before_any_rank_starts(no_ranks, kwargs, match):
    args = {"world_size": 2, "numel": 8, **kwargs}
    with pytest.raises(ValueError, match=match):
        check_collectives(**args)


def test_reference_on_a_hand_worked_example():
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])
    assert [x.tolist() for x in reference("broadcast", [a, b])] == [[1, 2], [1, 2]]
    assert [x.tolist() for x in reference("all-reduce", [a, b])] == [[4, 6], [4, 6]]
    assert [x.tolist() for x in reference("all-gather", [a, b])] == [[1, 2, 3, 4]] * 2
    assert [x.tolist() for x in reference("reduce-scatter", [a, b])] == [[4], [6]]
    assert [x.tolist() for x in reference("all-to-all", [a, b])] == [[1, 3], [2, 4]]


def test_formulas():
    V = 1200
    for t in (1, 2, 3, 4, 8):
        ring = (t - 1) / t * V
        assert formula_bytes("all-reduce", t, V) == [2 * ring] * t
        for name in ("all-gather", "reduce-scatter", "all-to-all"):
            assert formula_bytes(name, t, V) == [ring] * t
        tree = formula_bytes("broadcast", t, V)
        assert sum(tree) == (t - 1) * V                     # every rank but the root receives V once
        assert tree[0] == (t - 1).bit_length() * V           # the root sends ceil(log2 t) times
    assert formula_bytes("broadcast", 4, V) == [2 * V, V, 0, 0]


def test_measured_bytes_follow_the_formulas():
    rows = cc.measure_bytes(world_sizes=(2, 3), numel=6 * 256)
    for name in ("broadcast", "all-gather", "all-to-all"):
        assert all(r["measured"] == r["formula"] for r in rows if r["collective"] == name), name
    for t in (2, 3):
        ar = [r for r in rows if r["collective"] == "all-reduce" and r["world_size"] == t]
        assert sum(r["measured"] for r in ar) == pytest.approx(sum(r["formula"] for r in ar),
                                                               rel=0.01)
    # gloo's reduce-scatter all-reduces inside: between the ring formula and twice it.
    for r in rows:
        if r["collective"] == "reduce-scatter":
            assert r["formula"] <= r["measured"] <= 2.02 * r["formula"]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_point_to_point_ring_all_gather_passes_and_sends_the_ring_bytes(world_size):
    report = check_collectives(world_size, numel=2 * world_size, collectives=("all-gather",),
                               implementations={"all-gather": coll.ring_all_gather})
    assert report.passed
    assert all(r["bytes_measured"] == r["bytes_formula"] for r in report.rows_for("all-gather"))


def test_a_wrong_user_implementation_fails():
    report = check_collectives(2, numel=4, collectives=("all-gather",),
                               implementations={"all-gather": lambda x: torch.cat([x, x])})
    assert not report.passed
    assert [r.passed for r in report.rows] == [False, False]


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_all_reduce_equals_reduce_scatter_then_all_gather(world_size):
    result = cc.all_reduce_as_reduce_scatter_all_gather(world_size, numel=12 * 32)
    assert result["passed"]
    formula = result["formula"]
    assert formula["all-reduce"] == formula["reduce-scatter"] + formula["all-gather"]
    for r in result["ranks"]:
        assert r["then_all_gather"] == r["all_reduce"]
        assert r["ring_reduce_scatter"] == r["reduce_scatter"]
        sent = r["bytes"]
        assert sent["ring reduce-scatter (send/recv)"] == formula["reduce-scatter"]
        assert sent["all-gather"] == formula["all-gather"]


def test_deadlock_demo_times_out_with_a_message_then_ranks_work_again():
    with pytest.raises(RankTimeoutError) as info:
        cc.deadlock_demo(world_size=2, timeout=2.0)
    assert "all_reduce" in str(info.value) and "rank 0" in str(info.value)
    assert check_collectives(2, numel=2, collectives=("all-reduce",)).passed
    with pytest.raises(ValueError):
        cc.deadlock_demo(world_size=1)


def test_figures_and_explorer_draw_the_report(monkeypatch):
    import mtb_helpers.collectives.widget as explorer_module
    from mtb_helpers.collectives.plots import plot_bytes, plot_collective, plot_decomposition

    report = check_collectives(2, numel=4, bug="allgather-rank-order")
    fig = plot_collective(report.to_dict(), "all-gather")
    texts = {t.get_text() for ax in fig.axes for t in ax.texts}
    assert {"4", "9", "15", "want 4"} <= texts   # values in the cells, the wanted one under a wrong one
    assert "DIFFERS" in fig._suptitle.get_text() and fig.legends
    with pytest.raises(ValueError):
        plot_collective(report, "broadcast-ish")
    rows = [{"collective": c, "world_size": t, "rank": r, "V_bytes": 64, "measured": 32,
             "formula": f} for c in COLLECTIVES for t in (1, 2)
            for r, f in enumerate(formula_bytes(c, t, 64))]
    assert len(plot_bytes(rows).axes) == len(COLLECTIVES)
    assert len(plot_decomposition(cc.all_reduce_as_reduce_scatter_all_gather(2, 4)).axes) == 3
    png, text = explorer_module.render(3, "all-to-all", 2, inject_bug=True)
    assert text.startswith("FAIL") and "alltoall-wrong-split" in text and png.startswith(b"\x89PNG")
    calls = []
    monkeypatch.setattr(explorer_module, "render",
                        lambda *args: calls.append(args) or (matplotlib.figure.Figure(), "line"))
    box = explorer_module.collectives_explorer(world_size=2, collective="broadcast", per_chunk=1)
    box.children[0].children[1].value = "reduce-scatter"   # the collective dropdown
    box.children[0].children[0].value = 4                  # the world-size slider
    assert calls == [(2, "broadcast", 1, False), (2, "reduce-scatter", 1, False),
                     (4, "reduce-scatter", 1, False)]
    matplotlib.pyplot.close("all")


def test_the_explorer_injects_a_bug_only_where_its_declared_needs_hold():
    import matplotlib
    matplotlib.use("Agg")
    from mtb_helpers.collectives.widget import render

    text = render(2, "all-to-all", 1, inject_bug=True)[1]      # one element per chunk: cannot show
    assert text.startswith("PASS") and "bug=None" in text and "2 or more elements per rank's chunk" in text
    text = render(2, "all-to-all", 2, inject_bug=True)[1]
    assert text.startswith("FAIL") and "bug=alltoall-wrong-split" in text
