"""The tensor-parallel explorer re-runs its check on real ranks when a control changes."""
from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

from mtb_helpers.tp.widget import run_explorer_check, summary, tp_explorer  # noqa: E402


def _controls(explorer):
    first_row, second_row, _ = explorer.children
    size, per_rank, other = first_row.children
    dtype, bug = second_row.children
    return size, per_rank, other, dtype, bug


def _shown(explorer) -> tuple[str, list[bytes]]:
    """The summary line and the PNGs the explorer shows now (the check table is the 2nd HTML)."""
    summary, table, *figures = explorer.children[-1].children
    assert "<table" in table.value
    return summary.value, [bytes(f.value) for f in figures]


@pytest.mark.parametrize("kind", ["column", "row", "mlp"])
def test_explorer_redraws_on_every_control(kind):
    explorer = tp_explorer(kind, world_size=2)
    text, figures = _shown(explorer)
    assert "PASS" in text and len(figures) == 2
    size, per_rank, _, _, bug = _controls(explorer)
    size.value = 3
    text, at_3 = _shown(explorer)
    assert "on 3 rank(s)" in text and all(a != b for a, b in zip(at_3, figures))
    assert bug.value == "none" and bug.index == 0  # shown selected, not blank
    bug.value = bug.options[1]
    text, broken = _shown(explorer)
    assert "FAIL (" in text and f"bug={bug.options[1]}" in text
    assert broken[1] != at_3[1]   # the error figure shows the failure


def test_summary_counts_the_mlps_two_all_reduces_and_names_failing_quantities():
    report = run_explorer_check("mlp", 2, 2, 4, "float64", None)
    assert "2 all-reduce(s)" in summary(report)
    broken = run_explorer_check("row", 2, 2, 4, "float32", "bias-before-allreduce")
    assert summary(broken).startswith("FAIL (output)")


def test_explorer_sets_gather_output_for_the_all_gather_bug():
    report = run_explorer_check("column", 2, 2, 4, "float32", "allgather-wrong-order")
    assert not report.passed and {r.quantity for r in report.failed()} == {"output"}


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="kind"):
        tp_explorer("diagonal")


def test_showing_puts_in_what_a_bug_sets_and_nothing_else():
    from mtb_helpers.checking.bug import showing
    args = {"out_features": 8, "gather_output": False}
    assert showing("allgather-wrong-order", args) == {"out_features": 8, "gather_output": True}
    assert showing("f-backward-identity", args) == args and showing(None, args) == args
    assert args["gather_output"] is False            # the caller's dict is not changed
    # neither front end names the bug itself any more: the Bug's `sets` is the one place
    import inspect
    from mtb_helpers.tp import cli, widget
    assert "allgather-wrong-order" not in inspect.getsource(cli) + inspect.getsource(widget)
