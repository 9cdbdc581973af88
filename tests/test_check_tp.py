"""The TP checks: every bug fails exactly the quantities it breaks; reports, traces, refusals."""
from __future__ import annotations

import json
import re

import pytest
import torch

from mtb_helpers import BUGS
from mtb_helpers.tp.check import check_column_parallel, check_row_parallel, check_tp_mlp
from mtb_helpers.tp.bugs import COLUMN_BUGS, MLP_BUGS, ROW_BUGS

# (check, extra kwargs, bug) -> the quantities that must fail, on every rank
BROKEN = [
    (check_column_parallel, {}, "f-backward-identity", {"input_grad"}),
    (check_column_parallel, {"gather_output": True}, "allgather-wrong-order", {"output"}),
    (check_row_parallel, {}, "bias-before-allreduce", {"output"}),
    (check_row_parallel, {"input_is_parallel": False}, "bias-before-allreduce", {"output"}),
    (check_row_parallel, {}, "row-missing-allreduce", {"output"}),
    (check_row_parallel, {}, "g-backward-allreduce", {"input_grad", "weight_grad"}),
    (check_tp_mlp, {}, "f-backward-identity", {"input_grad"}),
    (check_tp_mlp, {}, "bias-before-allreduce", {"output"}),
    (check_tp_mlp, {}, "row-missing-allreduce", {"output"}),
    (check_tp_mlp, {}, "g-backward-allreduce",
     {"input_grad", "fc1.weight_grad", "fc1.bias_grad", "fc2.weight_grad"}),
]


def test_every_tp_bug_is_listed_and_tested():
    assert set(COLUMN_BUGS + ROW_BUGS + MLP_BUGS) <= set(BUGS)
    tested = {(check.__name__, bug) for check, _, bug, _ in BROKEN}
    for name, bugs in (("check_column_parallel", COLUMN_BUGS), ("check_row_parallel", ROW_BUGS),
                       ("check_tp_mlp", MLP_BUGS)):
        assert {(name, bug) for bug in bugs} <= tested


@pytest.mark.parametrize("t", [2, 3])
@pytest.mark.parametrize("check, kwargs, bug, broken", BROKEN,
                         ids=[f"{c.__name__}-{b}-{sorted(k)}" for c, k, b, _ in BROKEN])
def test_bug_fails_exactly_the_quantities_it_breaks(check, kwargs, bug, broken, t):
    report = check(world_size=t, bug=bug, **kwargs)
    assert not report.passed
    failed = {(r.quantity, r.rank) for r in report.failed()}
    assert failed == {(q, rank) for q in broken for rank in range(t)}, str(report)
    assert set(report.quantities()) > broken      # something else was checked and passed
    assert report.config["bug"] == bug


def test_one_rank_has_nothing_to_get_wrong():
    # every TP bug is about communication; with one rank there is none, and the check says so
    assert check_row_parallel(world_size=1, bug="bias-before-allreduce").passed


def test_report_table_html_and_json():
    report = check_tp_mlp(world_size=2, seed=3, dtype="float64")
    assert report.passed and report.config["dtype"] == "float64" and report.config["seed"] == 3
    assert len(report.rows) == 6 * 2 and report.quantities()[0] == "output"
    text = str(report)
    assert "PASSED" in text and "fc2.weight_grad" in text and "fp64: distributed" in text
    assert "collectives on rank 0: forward: 1 all_reduce" in text
    assert repr(report).startswith("<Report tp_mlp [") and report.step(1) is report.steps[0]
    assert report.step("all-reduce (g forward)").collective["operator"] == "g"
    assert "<table>" in report._repr_html_() and "fc1.bias_grad" in report._repr_html_()
    data = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert data["passed"] is True and len(data["rows"]) == 12 and len(data["records"]) == 2
    assert {"quantity", "rank", "max_abs_err", "max_rel_err", "ulps", "tolerance", "passed",
            "fp64_err", "ref_fp64_err"} <= set(data["rows"][0])
    # float64 run: the dtype reference *is* the float64 reference
    assert all(r.fp64_err == r.max_abs_err and r.ref_fp64_err == 0 for r in report.rows)


def test_float32_distributed_error_is_no_worse_than_float32_itself():
    report = check_row_parallel(world_size=4)
    for r in report.rows:
        assert r.fp64_err <= 4 * max(r.ref_fp64_err, r.tolerance * 1e-2)
        assert 0 < r.tolerance < 1e-3


def test_failed_report_is_strict_json_and_marks_rows():
    report = check_column_parallel(world_size=2, bug="f-backward-identity")
    assert "FAILED (2 of 8 rows)" in str(report) and "NO" in report.table()
    assert "background" in report._repr_html_()
    json.dumps(report.to_dict(), allow_nan=False)


def test_step_trace_shows_who_holds_what_and_where_it_breaks():
    report = check_row_parallel(world_size=3, in_features=9, out_features=4, batch_shape=(2,))
    names = [s.name for s in report.steps]
    assert names[:3] == ["shard W by rows", "replicate bias", "shard X by columns"]
    w = report.steps[0]
    assert w.global_shape == (9, 4) and w.layout == "Shard(0)"    # W = weight.T, [in, out]: rows
    assert [h.rows for h in w.holdings] == [(0, 3), (3, 6), (6, 9)]
    assert all(h.cols == (0, 4) and h.shape == (3, 4) for h in w.holdings)
    partial = report.steps[names.index("local matmul")]
    assert partial.layout == "Partial()" and all(h.partial for h in partial.holdings)
    assert [s.layout for s in report.steps[:3]] == ["Shard(0)", "Replicate()", "Shard(-1)"]
    reduce = report.steps[names.index("all-reduce (g forward)")]
    assert reduce.collective["op"] == "all_reduce" and reduce.collective["bytes"] == 2 * 4 * 4
    assert all(s.passed for s in report.steps)

    broken = check_row_parallel(world_size=3, in_features=9, out_features=4, batch_shape=(2,),
                                bug="row-missing-allreduce")
    step = broken.steps[names.index("all-reduce (g forward)")]
    assert step.collective["missing"] and not step.passed
    assert all(h.max_abs_err is None for h in step.holdings)
    failing = [s.name for s in broken.steps if not s.passed]
    # the partial products are traced as the input handed to g: never handed over, never seen
    assert failing == ["local matmul", "all-reduce (g forward)", "add bias once"]
    assert broken.steps[names.index("local matmul")].holdings[0].shape is None
    assert broken.records[0].count("all_reduce") == 0


def test_column_trace_with_gather_and_records_per_rank():
    report = check_column_parallel(world_size=2, gather_output=True, batch_shape=(3,))
    names = [s.name for s in report.steps]
    assert "all-gather Y" in names and names.index("all-gather Y") == names.index("local matmul") + 1
    for rank, rec in enumerate(report.records):
        assert [(e.op, e.direction) for e in rec] == [
            ("all_gather", "forward"), ("split", "backward"), ("all_reduce", "backward")]
    assert report.steps[names.index("local matmul")].holdings[1].cols == (6, 12)
    wrong = check_column_parallel(world_size=2, gather_output=True, batch_shape=(3,),
                                  bug="allgather-wrong-order")
    assert [s.name for s in wrong.steps if not s.passed] == ["all-gather Y"]


@pytest.mark.parametrize("call, message", [
    (lambda: check_column_parallel(world_size=3, out_features=10), r"out_features=10 .* world size 3"),
    (lambda: check_row_parallel(world_size=4, in_features=6), r"in_features=6 .* world size 4"),
    (lambda: check_tp_mlp(world_size=5, ffn_hidden=24), r"ffn_hidden=24 .* world size 5"),
    (lambda: check_tp_mlp(world_size=9), r"world.size"),
    (lambda: check_tp_mlp(world_size=0), r"world.size"),
    (lambda: check_tp_mlp(batch_shape=(2, 0)), r"batch_shape\[1\] must be a positive integer"),
    (lambda: check_row_parallel(dtype=torch.float16), r"dtype"),
    (lambda: check_row_parallel(bug="no-such-bug"), r"unknown bug"),
    (lambda: check_row_parallel(bug="f-backward-identity"), r"does not apply"),
    (lambda: check_column_parallel(bug="allgather-wrong-order"), r"needs gather_output=True"),
])
def test_bad_input_is_refused_before_any_rank_starts(no_ranks, call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_the_no_ranks_fixture_stops_a_check_that_would_start_ranks(no_ranks):
    with pytest.raises(AssertionError, match="a rank was started"):
        check_tp_mlp(world_size=2)


def test_figures_draw_the_trace_with_titles_legends_and_red_failures():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mtb_helpers.plots.palette import FAIL_COLOR, rank_color
    from mtb_helpers.tp.plots import plot_errors, plot_step, plot_steps

    report = check_row_parallel(world_size=3, bug="row-missing-allreduce")
    fig = plot_step(report, "shard W by rows")
    assert len(fig.axes) == 3 and "shard W by rows" in fig._suptitle.get_text()
    assert "Shard(0): split by rows" in fig._suptitle.get_text()
    filled = [p for p in fig.axes[1].patches
              if matplotlib.colors.same_color(p.get_facecolor(), rank_color(1))]
    assert len(filled) == 1 and filled[0].get_height() == 4     # rank 1 holds rows 4:8 of W [12, 8]
    assert fig.legends and "NOT ISSUED" in plot_step(report, 5)._suptitle.get_text()
    overview = plot_steps(report, phase="forward")   # one panel per (step, rank), each with its error
    panels = [t.get_text() for t in overview.axes[0].texts if t.get_text().startswith("rank ")]
    assert len(panels) == 3 * sum(s.phase == "forward" for s in report.steps)
    assert all("\nerr " in text for text in panels)
    errors = plot_errors(report)
    ax = errors.axes[0]
    assert ax.get_yscale() == "log" and ax.get_ylabel() and ax.get_title() and ax.get_legend()
    red = [t.get_text() for t in ax.get_xticklabels()
           if matplotlib.colors.same_color(t.get_color(), FAIL_COLOR)]
    assert red == [f"{s.index}. {s.name}" for s in report.steps if not s.passed]
    by_quantity = plot_errors(report, by="quantity").axes[0]
    assert [t.get_text() for t in by_quantity.get_xticklabels()] == report.quantities()
    with pytest.raises(ValueError, match="no step"):
        plot_step(report, "no such step")
    plt.close("all")


def test_mlp_trace_numbers_the_backward_in_the_order_autograd_runs_it():
    # fc1's weight and bias grads come out of fc1's own backward node; f's all-reduce of dX runs
    # after it, the very last op. The trace numbers them so (notebook 03 reads the numbers).
    from torch import nn

    from mtb_helpers.tp import ParallelMLP

    names = [s.name for s in check_tp_mlp(world_size=2).steps]
    backward = names[names.index("activation grad"):]
    assert backward == ["activation grad", "fc2 weight grad", "fc2 bias grad", "local input grad",
                        "fc1 weight grad", "fc1 bias grad", "all-reduce dX (f backward)"]
    order = []
    mlp = ParallelMLP.from_full(nn.Linear(4, 8), nn.Linear(8, 4))   # one process: f is the identity
    x = torch.randn(3, 4, requires_grad=True)
    for name, tensor in (("fc1 weight grad", mlp.fc1.weight), ("fc1 bias grad", mlp.fc1.bias),
                         ("dX", x)):
        tensor.register_hook(lambda grad, name=name: order.append(name))
    mlp(x).sum().backward()
    assert order[-1] == "dX" and set(order) == {"fc1 weight grad", "fc1 bias grad", "dX"}


def _bare_b(text: str) -> list[str]:
    """The words of ``text`` that name a bias ``b`` (``b``, ``db``, ``b_r``, ``db_r``, ``b_0``),
    not ``b1``/``b2`` (the MLP's biases, glossary) or a word that merely starts with b."""
    return re.findall(r"(?<![A-Za-z0-9_])d?b(?:_\w+)?(?![A-Za-z0-9_])", text)


def test_single_layer_traces_call_the_bias_bias_never_the_batch_letter_b():
    # the glossary's b is the batch size; notebooks 01-02 print these traces, so a single layer's
    # bias is `bias` (PyTorch's name) in every step label, and the MLP of 03 keeps b1 and b2
    for report in (check_column_parallel(world_size=2, gather_output=True),
                   check_row_parallel(world_size=2), check_row_parallel(world_size=2,
                                                                        input_is_parallel=False)):
        for s in report.steps:
            assert not _bare_b(f"{s.name} {s.tensor} {s.formula}"), str(s)
        bias = [s.tensor for s in report.steps
                if s.name in ("shard bias", "replicate bias", "bias grad")]
        assert bias == ["bias", "dbias"]
    assert "shard bias" in [s.name for s in check_column_parallel(world_size=2).steps]
    mlp = {s.name: s for s in check_tp_mlp(world_size=2).steps}
    assert mlp["add b2 once"].formula == "Y = Y_sum + b2" and mlp["fc1 bias grad"].tensor == "db1"


def test_printed_layer_code_and_pytorch_map_call_the_bias_bias():
    # notebooks 01-02 print these forwards with inspect.getsource and the comparison's map
    import inspect

    from mtb_helpers.tp import ColumnParallelLinear, RowParallelLinear
    from mtb_helpers.tp import bugs
    from mtb_helpers.tp.pytorch import _MAP

    for obj in (ColumnParallelLinear.forward, RowParallelLinear.forward,
                bugs.RowBiasBeforeAllReduce.forward, bugs.RowWithoutAllReduce.forward,
                bugs.RowGBackwardAllReduce.forward):
        comments = " ".join(line.split("#", 1)[1] for line in inspect.getsource(obj).splitlines()
                            if "#" in line)
        assert not _bare_b(comments), obj.__qualname__
    assert not _bare_b(" ".join(a + " " + b for rows in _MAP.values() for a, b in rows))
