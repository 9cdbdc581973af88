"""Data-parallel explorer: world size, strategy and a deliberate bug; the errors per quantity, the
bytes each rank holds and sends, and a summary redraw on every change.

Core ipywidgets only (IntSlider, Dropdown, the shared frame ``widgets.frame.live_view``), so it
runs on 7.7 and 8. Every change re-runs ``check_data_parallel`` on warm ranks.
"""
from __future__ import annotations

import ipywidgets as widgets

from mtb_helpers.plots.errors import errors_png
from mtb_helpers.widgets.frame import live_view
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
    size = widgets.IntSlider(value=world_size, min=1, max=4, description="world size p",
                             style={"description_width": "initial"}, continuous_update=False)
    choose = widgets.Dropdown(options=list(STRATEGIES), value=strategy, description="strategy")
    broken = widgets.Dropdown(options=["none", *DP_BUGS], value=bug or "none", description="bug")
    view = widgets.Dropdown(options=list(VIEWS), value=VIEWS[0], description="show")

    def render() -> list:
        try:
            report = check_data_parallel(world_size=size.value, strategy=choose.value, batch=12,
                                         bug=None if broken.value == "none" else broken.value)
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
