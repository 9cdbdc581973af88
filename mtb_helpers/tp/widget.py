"""The tensor-parallel explorer: change the world size, the shapes, the dtype or inject a bug, and
the check re-runs on real ranks; the summary, the check table, the shard layouts and the error
figure redraw. One explorer serves notebooks 01 (column), 02 (row) and 03 (MLP)."""
from __future__ import annotations

import ipywidgets as widgets
import torch
from mtb_helpers.tp.check import check_column_parallel, check_row_parallel, check_tp_mlp
from mtb_helpers.plots.errors import errors_png
from mtb_helpers.tp.plots import steps_png
from mtb_helpers.checking.bug import showing
from mtb_helpers.checking.report import Report
from mtb_helpers.tp.bugs import COLUMN_BUGS, MLP_BUGS, ROW_BUGS
from mtb_helpers.widgets.frame import SLIDER, bug_menu, chosen, live_view, menu, world_size_slider

# kind -> (check, its bugs, the sharded dimension's name, the other dimension's name)
KINDS = {
    "column": (check_column_parallel, COLUMN_BUGS, "out_features", "in_features"),
    "row": (check_row_parallel, ROW_BUGS, "in_features", "out_features"),
    "mlp": (check_tp_mlp, MLP_BUGS, "ffn_hidden", "hidden"),
}


def run_explorer_check(kind: str, world_size: int, per_rank: int, other: int, dtype: str,
                       bug: str | None) -> Report:
    """Run the ``kind`` check with the sharded dimension = ``per_rank`` x ``world_size`` (so it
    always divides) and the other dimension = ``other``, on a [2, 3] batch."""
    check, _, sharded, unsharded = KINDS[kind]
    kwargs = {sharded: per_rank * world_size, unsharded: other}
    # a bug that needs an argument on (the all-gather's order: gather_output) gets it
    return check(world_size=world_size, dtype=getattr(torch, dtype), bug=bug, **showing(bug, kwargs))


def summary(report: Report) -> str:
    """One line: verdict, which quantities fail, and what the ranks communicated."""
    record = report.records[0]
    sent = record.total_bytes(sent=True)
    verdict = report.verdict()
    return (f"{verdict}: {report.check} on {len(report.records)} rank(s), "
            f"bug={report.config.get('bug')}; rank 0 issued {record.count('all_reduce')} "
            f"all-reduce(s) and {record.count('all_gather')} all-gather(s), sending {sent} B")


def tp_explorer(kind: str = "mlp", world_size: int = 2) -> widgets.VBox:
    """The explorer widget for ``kind`` in {"column", "row", "mlp"}; display it."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    _, bugs, sharded, unsharded = KINDS[kind]
    size = world_size_slider(world_size, "world size t")
    per_rank = widgets.IntSlider(value=2, min=1, max=6, description=f"{sharded} / t", **SLIDER)
    other = widgets.IntSlider(value=4, min=1, max=8, description=unsharded, **SLIDER)
    dtype = menu("dtype", ["float32", "float64"])
    bug = bug_menu(bugs)

    def render() -> list:
        report = run_explorer_check(kind, size.value, per_rank.value, other.value, dtype.value,
                                    chosen(bug))
        return [summary(report), report, steps_png(report, phase="forward"), errors_png(report)]

    return live_view([[size, per_rank, other], [dtype, bug]], render)
