"""Data-parallel explorer: world size, strategy and a deliberate bug; the errors per quantity, the
bytes each rank holds and sends, and a summary redraw on every change (``check_data_parallel``
re-runs on warm ranks)."""
from __future__ import annotations

import ipywidgets as widgets

from mtb_helpers.plots.errors import errors_png
from mtb_helpers.widgets.frame import bug_menu, chosen, live_view, menu, world_size_slider
from mtb_helpers.dp.check import check_data_parallel
from mtb_helpers.dp.strategies import STRATEGIES
from mtb_helpers.dp.bugs import DP_BUGS
from mtb_helpers.dp.plots import plot_communication, plot_holdings, plot_memory
from mtb_helpers.checking.report import Report

__all__ = ["dp_summary", "explore_data_parallel"]

VIEWS = ("errors per quantity", "bytes held", "bytes sent", "who holds what")


def dp_summary(report: Report) -> str:
    """A few lines: verdict, failing quantities by rank, bytes held and sent by rank 0 vs formula."""
    lines = [report.title(), *report.failure_lines()]
    mem, comm = report.extra["memory"], report.extra["communication"]
    held = mem["per_rank"][0]
    lines.append(f"rank 0 holds {held['params']} + {held['grads']} + {held['optimizer_state']} B "
                 f"(params + grads + Adam state), accounting {sum(mem['ours'].values())} B")
    lines.append(f"rank 0 sent {comm['per_rank'][0]['total']} B; {comm['formula_text']} = "
                 f"{comm['formula']} B")
    lines.append(f"collectives on rank 0: {report.records[0].summary()}")
    return "\n".join(lines)


def explore_data_parallel(world_size: int = 2, strategy: str = "ddp",
                          bug: str | None = None) -> widgets.VBox:
    """The explorer widget; display it (it is the last expression of a notebook cell)."""
    size = world_size_slider(world_size)
    choose = menu("strategy", STRATEGIES, strategy)
    broken = bug_menu(DP_BUGS, bug)
    view = menu("show", VIEWS)

    def render() -> list:
        try:
            report = check_data_parallel(world_size=size.value, strategy=choose.value, batch=12,
                                         bug=chosen(broken))
        except ValueError as exc:   # e.g. a bug that does not apply to this strategy: say why
            return [f"cannot run: {exc}"]
        if view.value == "errors per quantity":
            fig = errors_png(report, by="quantity")
        elif view.value == "who holds what":
            fig = plot_holdings(size.value, (choose.value,))
        else:
            fig = (plot_memory if view.value == "bytes held" else plot_communication)([report])
        return [fig, dp_summary(report)]

    return live_view([[size, choose], [broken, view]], render)
