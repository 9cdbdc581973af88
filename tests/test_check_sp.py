"""check_sequence_parallel: every bug fails exactly the quantities it breaks; the trace, the
memory figures in the report, refusals before any rank starts, and the figures."""
from __future__ import annotations

import json

import pytest
import torch

from mtb_helpers import BUGS
from mtb_helpers.sp.check import check_sequence_parallel
from mtb_helpers.sp.bugs import SP_BUGS

PARAM_GRADS = {"ln.weight_grad", "ln.bias_grad", "fc1.weight_grad", "fc1.bias_grad",
               "fc2.weight_grad", "fc2.bias_grad"}


def _expected(bug: str, t: int) -> set[tuple[str, int]]:
    """The (quantity, rank) rows each bug must break, derived from what it does."""
    everywhere = lambda qs: {(q, r) for q in qs for r in range(t)}   # noqa: E731
    if bug == "sp-no-layernorm-grad-allreduce":
        # each rank keeps the LayerNorm grads of its own tokens; nothing else is touched
        return everywhere({"ln.weight_grad", "ln.bias_grad"})
    if bug == "sp-same-dropout-mask":
        # rank 0's local positions are the global ones, so its own tokens are right; every other
        # shard drops the wrong elements, and every parameter grad sums over all shards
        later = {(q, r) for q in ("output", "dropout", "input_grad") for r in range(1, t)}
        return later | everywhere(PARAM_GRADS)
    if bug == "sp-allreduce-instead-of-reduce-scatter":
        # forward values are right; backward lacks the all-gather of dZ, so everything upstream
        # of fc2's output misses the other shards; fc2's bias grad is summed over ranks anyway
        return everywhere({"input_grad"} | PARAM_GRADS - {"fc2.bias_grad"})
    raise AssertionError(bug)


def test_every_sp_bug_is_listed():
    assert set(SP_BUGS) <= set(BUGS)
    assert all(BUGS[b] for b in SP_BUGS)


@pytest.mark.parametrize("t", [2, 3])
@pytest.mark.parametrize("bug", SP_BUGS)
def test_bug_fails_exactly_the_quantities_it_breaks(bug, t):
    report = check_sequence_parallel(world_size=t, seq_len=6, ffn_hidden=12, bug=bug, dropout_p=0.2)
    assert not report.passed
    assert {(r.quantity, r.rank) for r in report.failed()} == _expected(bug, t), str(report)
    assert report.config["bug"] == bug


def test_with_one_rank_no_sp_bug_has_anything_to_break():
    for bug in SP_BUGS:
        assert check_sequence_parallel(world_size=1, bug=bug).passed


def test_missing_reduce_scatter_shows_in_the_trace_and_the_record():
    report = check_sequence_parallel(world_size=2, bug="sp-allreduce-instead-of-reduce-scatter")
    by_name = {s.name: s for s in report.steps}
    step = by_name["reduce-scatter along the sequence"]
    assert step.collective["missing"] and not step.passed
    assert by_name["residual on the shard"].passed         # the forward values are right
    rec = report.records[0]
    assert rec.count("reduce_scatter", "forward") == 0 and rec.count("all_reduce", "forward") == 1
    assert rec.count("all_gather", "backward") == 0


def test_trace_follows_the_sequence_shards_through_the_block():
    report = check_sequence_parallel(world_size=4, seq_len=8, batch=2, hidden=4, ffn_hidden=8)
    assert report.passed, str(report)
    by_name = {s.name: s for s in report.steps}
    first = by_name["shard X by sequence"]
    assert first.global_shape == (16, 4) and first.layout == "Shard(0)"    # [s*b, h]
    assert [h.rows for h in first.holdings] == [(0, 4), (4, 8), (8, 12), (12, 16)]
    gathered = by_name["all-gather along the sequence"]
    assert gathered.collective["op"] == "all_gather"
    assert gathered.collective["bytes"] == 2 * 2 * 4 * 4          # the [s/t, b, h] shard, float32
    assert all(h.rows == (0, 16) for h in gathered.holdings)
    partial = by_name["fc2 local matmul"]
    assert partial.layout == "Partial()" and all(h.partial for h in partial.holdings)
    scattered = by_name["reduce-scatter along the sequence"]
    assert scattered.collective["op"] == "reduce_scatter" and scattered.holdings[2].rows == (8, 12)
    grad = by_name["all-reduce d(ln.weight)"]
    assert grad.collective["operator"] == "ln.weight" and grad.collective["direction"] == "backward"
    names = [s.name for s in report.steps]
    assert names.index("all-gather along the sequence") < names.index("fc1 local matmul")


def test_report_carries_activation_memory_and_is_strict_json():
    report = check_sequence_parallel(world_size=2, dtype="float64", seed=4)
    data = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert data["passed"] is True and data["config"]["dtype"] == "float64"
    assert len(data["rows"]) == 9 * 2 and {r["quantity"] for r in data["rows"]} >= {"dropout", "ln.bias_grad"}
    mem = data["activation_memory"]
    assert mem["world_size"] == 2 and mem["dtype"] == "float64"
    tp, sp = mem["variants"]["tp"], mem["variants"]["sp"]
    assert sp["measured_total"] < tp["measured_total"]
    assert tp["measured_total"] == tp["model_total"] and sp["measured_total"] == sp["model_total"]
    assert sp["measured"]["LayerNorm input"] * 2 == tp["measured"]["LayerNorm input"] == 8 * 2 * 8 * 8
    assert sp["communication"]["activation_sent"] == tp["communication"]["activation_sent"]
    assert "PASSED" in str(report) and "ln.weight_grad" in report.table()


@pytest.mark.parametrize("call, message", [
    (lambda: check_sequence_parallel(world_size=3, seq_len=8), r"seq_len=8 .* world size 3"),
    (lambda: check_sequence_parallel(world_size=2, seq_len=7), r"seq_len=7 .* world size 2"),
    (lambda: check_sequence_parallel(world_size=4, seq_len=8, ffn_hidden=6), r"ffn_hidden=6 .* world size 4"),
    (lambda: check_sequence_parallel(seq_len=0), r"seq_len must be a positive integer"),
    (lambda: check_sequence_parallel(hidden=2.5), r"hidden must be a positive integer"),
    (lambda: check_sequence_parallel(dropout_p=1.0), r"dropout_p must be a number in \[0, 1\)"),
    (lambda: check_sequence_parallel(world_size=0), r"world.size"),
    (lambda: check_sequence_parallel(dtype=torch.float16), r"dtype"),
    (lambda: check_sequence_parallel(bug="no-such-bug"), r"unknown bug"),
    (lambda: check_sequence_parallel(bug="f-backward-identity"), r"does not apply"),
    (lambda: check_sequence_parallel(bug="sp-same-dropout-mask", dropout_p=0), r"needs dropout_p > 0"),
])
def test_bad_input_is_refused_before_any_rank_starts(no_ranks, call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_figures_have_rank_colours_titles_legends_and_red_failures():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mtb_helpers.plots.palette import FAIL_COLOR, rank_color
    from mtb_helpers.sp.plots import (plot_activation_memory, plot_communication, plot_errors,
                                      plot_sequence_layout)
    from mtb_helpers.sp.memory import measure_activation_memory

    report = check_sequence_parallel(world_size=2, bug="sp-allreduce-instead-of-reduce-scatter")
    fig = plot_sequence_layout(report, "forward")
    ax = fig.axes[0]
    assert "FAILED" in ax.get_title() and ax.get_ylabel() == "sequence position" and fig.legends
    # rank 1's shard of the input covers sequence rows 4..8: one rectangle in its colour
    ones = [p for p in ax.patches if matplotlib.colors.same_color(p.get_facecolor(), rank_color(1))
            and p.get_x() < 1]
    assert [(p.get_y(), p.get_height()) for p in ones] == [(4, 4)]
    red = [t.get_text() for t in ax.get_xticklabels()
           if matplotlib.colors.same_color(t.get_color(), FAIL_COLOR)]
    assert any("reduce-" in t and "NOT ISSUED" in t for t in red)
    assert plot_sequence_layout(report, "backward").axes[0].get_title()
    assert plot_errors(report, by="quantity").axes[0].get_yscale() == "log"
    with pytest.raises(ValueError, match="no 'sideways'"):
        plot_sequence_layout(report, "sideways")
    figures = measure_activation_memory((1, 2))
    mem = plot_activation_memory(figures).axes[0]
    assert mem.get_title() and mem.get_ylabel() and mem.get_legend()
    assert [t.get_text() for t in mem.get_xticklabels()] == ["t = 1", "t = 2"]
    comm = plot_communication(figures).axes[0]
    assert comm.get_title() and comm.get_legend()
    plt.close("all")


def test_explorer_summary_and_controls():
    import matplotlib
    matplotlib.use("Agg")

    from mtb_helpers.sp.widget import VIEWS, explore_sequence_parallel, sp_summary

    text = sp_summary(check_sequence_parallel(world_size=2, bug="sp-no-layernorm-grad-allreduce"))
    assert "FAILED" in text and "fails: ln.weight_grad on ranks 0, 1" in text
    assert "saved for backward per rank: TP only" in text and "collectives on rank 0" in text
    widget = explore_sequence_parallel(world_size=2, seq_len=8)
    controls = {c.description: c for row in widget.children[:-1] for c in row.children}
    assert set(controls) == {"world size t", "sequence length s", "dropout_p", "bug", "show"}
    assert controls["bug"].options == ("none", *SP_BUGS)
    assert list(controls["show"].options) == list(VIEWS)


def test_the_traced_run_counts_as_the_sp_variant_and_measures_the_same():
    """Without a bug the traced block is the SP variant: its saved bytes and collectives are taken
    from the traced run (one block run fewer); they must equal a separate measurement."""
    from mtb_helpers.sp.memory import measure_activation_memory

    separate = measure_activation_memory((2,), ffn_hidden=32)[0]["variants"]
    for bug in (None, "sp-no-layernorm-grad-allreduce"):
        shared = check_sequence_parallel(world_size=2, bug=bug).extra["activation_memory"]
        assert shared["variants"] == separate, bug
    only = check_sequence_parallel(world_size=2, memory_variants=("tp", "sp"))
    assert set(only.extra["activation_memory"]["variants"]) == {"tp", "sp"} and only.passed
    with pytest.raises(ValueError, match="memory_variants"):
        check_sequence_parallel(world_size=2, memory_variants=("tp", "zero"))
