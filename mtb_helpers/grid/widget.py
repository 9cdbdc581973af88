"""The TP x DP explorer: pick how 4 ranks form a grid (tp x dp), the dtype or a bug; the check
re-runs on real ranks and the summary, the grid with each group's collectives, the check table
and the error figure redraw."""
from __future__ import annotations

import ipywidgets as widgets

from mtb_helpers.grid.check import GRID_BUGS, check_grid
from mtb_helpers.grid.plots import grid_png
from mtb_helpers.plots.errors import errors_png
from mtb_helpers.checking.report import Report
from mtb_helpers.widgets.frame import bug_menu, chosen, live_view, menu

__all__ = ["grid_choices", "grid_summary", "grid_explorer"]


def grid_choices(world_size: int) -> list[tuple[str, tuple[int, int]]]:
    """Every ``tp x dp`` factorisation of ``world_size``, as dropdown options."""
    return [(f"tp={tp} x dp={world_size // tp}", (tp, world_size // tp))
            for tp in range(1, world_size + 1) if world_size % tp == 0]


def grid_summary(report: Report) -> str:
    """One line: verdict, the failing quantities, and what rank 0 sent in each kind of group."""
    verdict = report.verdict()
    parts = [f"{e['all_reduces']} {'TP' if e['kind'] == 'tp' else 'gradient'} all-reduce(s) in "
             f"ranks {e['ranks']} ({e['sent']} B sent)" for e in report.extra["traffic"][0]]
    cfg = report.config
    return (f"{verdict}: tp={cfg['tp']} x dp={cfg['dp']}, bug={cfg['bug']}; rank 0 issued "
            + ("; ".join(parts) or "nothing"))


def grid_explorer(world_size: int = 4) -> widgets.VBox:
    """The explorer widget for a grid of ``world_size`` ranks (4 in the notebook); display it."""
    choices = dict(grid_choices(world_size))   # plain string options: ipywidgets 7 shows them
    default = next((k for k, (tp, _) in choices.items() if tp == 2), next(iter(choices)))
    shape = menu("grid", choices, default)
    dtype = menu("dtype", ["float32", "float64"])
    bug = bug_menu(GRID_BUGS)
    def render() -> list:
        tp, dp = choices[shape.value]
        report = check_grid(world_size=world_size, tp=tp, dp=dp, dtype=dtype.value, bug=chosen(bug))
        return [grid_summary(report), grid_png(report), errors_png(report, by="quantity"), report]

    return live_view([[shape, dtype, bug]], render)
