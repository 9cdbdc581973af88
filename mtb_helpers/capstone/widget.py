"""Capstone explorer: choose tp / pp / dp / cp (only layouts whose sizes divide are offered), the
steps, the DP strategy and a deliberate bug; see the loss curves, who holds what, or the bytes per
group. Core ipywidgets only (Dropdown, IntSlider, Output via ``live_view``), 7.7 and 8 alike.
"""
from __future__ import annotations

import ipywidgets as widgets

from mtb_helpers.capstone.bugs import CAPSTONE_BUGS
from mtb_helpers.capstone.check import check_capstone
from mtb_helpers.capstone.plots import plot_bytes, plot_losses, plot_rank_grid
from mtb_helpers.capstone.validate import DP_STRATEGIES, admissible_layouts
from mtb_helpers.widgets.frame import live_view

__all__ = ["explore_capstone", "capstone_summary", "layout_options"]

VIEWS = ("loss curves", "who holds what", "bytes per group")


def layout_options(world_sizes=(1, 2, 4, 8)) -> list[str]:
    """``"tp=2 pp=2 dp=2 cp=1"`` for every admissible layout (string options: ipywidgets 7)."""
    return [str(layout) for layout in admissible_layouts(world_sizes)]


def _parse(option: str) -> dict[str, int]:
    return {k: int(v) for k, v in (part.split("=") for part in option.split())}


def capstone_summary(report) -> str:
    """Verdict, the worst loss and parameter error against their tolerances, bytes of rank 0."""
    loss = [r for r in report.rows if r.quantity == "loss"]
    params = [r for r in report.rows if r.quantity == "params"]
    worst_loss = max(loss, key=lambda r: r.max_abs_err)
    worst_params = max(params, key=lambda r: r.max_abs_err)
    sent = report.extra["bytes"]["per_rank"][0]
    return "\n".join([
        report.title().split(" [")[0] + (" PASSED" if report.passed else " FAILED"),
        f"worst loss error {worst_loss.max_abs_err:.1e} ({worst_loss.note}), "
        f"tolerance {worst_loss.tolerance:.0e}",
        f"worst parameter error {worst_params.max_abs_err:.1e} (rank {worst_params.rank}), "
        f"tolerance {worst_params.tolerance:.0e}",
        "rank 0 sends per step: " + ", ".join(f"{g} {b} B" for g, b in sent.items())])


def explore_capstone(layout: str = "tp=2 pp=2 dp=2 cp=1", steps: int = 3) -> widgets.VBox:
    """The explorer; display it (the last expression of a cell). Each change trains again."""
    options = layout_options()
    choose = widgets.Dropdown(options=options, value=layout if layout in options else options[0],
                              description="layout")
    n_steps = widgets.IntSlider(value=steps, min=2, max=8, description="steps",
                                continuous_update=False)
    strategy = widgets.Dropdown(options=list(DP_STRATEGIES), value="ddp", description="DP")
    bug = widgets.Dropdown(options=["none", *CAPSTONE_BUGS], value="none", description="bug")
    view = widgets.Dropdown(options=list(VIEWS), value=VIEWS[0], description="show")

    def render():
        sizes = _parse(choose.value)
        report = check_capstone(**sizes, steps=n_steps.value, strategy=strategy.value,
                                bug=None if bug.value == "none" else bug.value)
        data = report.to_dict()
        if view.value == "loss curves":
            fig = plot_losses(data["losses"]["parallel"], data["losses"]["reference"],
                              choose.value + ("" if bug.value == "none" else f" + {bug.value}"),
                              title=None if report.passed else "Loss per step: the curves part")
        elif view.value == "who holds what":
            fig = plot_rank_grid(data["grid"], sizes)
        else:
            fig = plot_bytes(data["bytes"])
        return [fig, capstone_summary(report)]

    return live_view([[choose, n_steps], [strategy, bug, view]], render)
