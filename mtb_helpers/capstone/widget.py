"""Capstone explorer: choose tp / pp / dp / cp (only layouts whose sizes divide are offered), the
steps, the DP strategy and a deliberate bug; see the loss curves, who holds what, or the bytes per
group. Core ipywidgets only (Dropdown, IntSlider, Output via ``live_view``), 7.7 and 8 alike.

The loss curves are a two-layer figure (``plots.live``): the axes, the legend, the tolerance and
the one-process curve (the same for every layout) are drawn once per number of steps; a move
draws the parallel run's points and the title over them.
"""
from __future__ import annotations

import math

import ipywidgets as widgets
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import blended_transform_factory

from mtb_helpers.capstone.bugs import CAPSTONE_BUGS
from mtb_helpers.capstone.check import check_capstone
from mtb_helpers.capstone.plots import plot_bytes, plot_rank_grid
from mtb_helpers.capstone.validate import DP_STRATEGIES, admissible_layouts
from mtb_helpers.plots.live import LiveFigure, Png
from mtb_helpers.widgets.frame import live_view

__all__ = ["explore_capstone", "capstone_summary", "layout_options", "losses_png"]

VIEWS = ("loss curves", "who holds what", "bytes per group")


def layout_options(world_sizes=(1, 2, 4, 8)) -> list[str]:
    """``"tp=2 pp=2 dp=2 cp=1"`` for every admissible layout (string options: ipywidgets 7)."""
    return [str(layout) for layout in admissible_layouts(world_sizes)]


def _parse(option: str) -> dict[str, int]:
    return {k: int(v) for k, v in (part.split("=") for part in option.split())}


def capstone_summary(report) -> str:
    """Verdict, the worst loss, step and parameter errors against their tolerances (each step is
    judged on its own: the reference takes it from the parallel run's state), bytes of rank 0."""
    def worst(quantity: str):
        return max((r for r in report.rows if r.quantity == quantity), key=lambda r: r.max_abs_err)

    loss, step, params = worst("loss"), worst("step"), worst("params")
    failed = sorted({r.note.split(";")[0] for r in report.rows
                     if r.quantity == "step" and not r.passed}, key=lambda n: int(n.split()[-1]))
    sent = report.extra["bytes"]["per_rank"][0]
    return "\n".join([
        report.title().split(" [")[0] + (" PASSED" if report.passed else " FAILED"),
        f"worst loss error {loss.max_abs_err:.1e} ({loss.note}), tolerance {loss.tolerance:.0e}",
        f"worst step error {step.max_abs_err:.1e} ({step.note}: all parameters after the step "
        f"against one process taking it from the same state), tolerance {step.tolerance:.0e}"
        + (f"; wrong at {', '.join(failed)}" if failed else ""),
        f"worst parameter error {params.max_abs_err:.1e} (rank {params.rank}), "
        f"tolerance {params.tolerance:.0e}",
        "rank 0 sends per step: " + ", ".join(f"{g} {b} B" for g, b in sent.items())])


FLOOR = 1e-17   # an exact 0 is drawn here on the log scale


def _limits(parallel: list[float], reference: list[float]) -> tuple:
    """The static layer's y limits: the one-process curve's, widened in steps of 0.5 when the
    parallel run leaves them; the error axis up to the decade above the largest error."""
    lo, hi = min(reference), max(reference)
    pad = max(0.08 * (hi - lo), 0.05)
    top = (lo - pad, hi + pad)
    finite = [v for v in parallel if v is not None and math.isfinite(v)]
    if finite and (min(finite) < top[0] or max(finite) > top[1]):
        top = (math.floor(min(lo, *finite) * 2) / 2 - 0.25, math.ceil(max(hi, *finite) * 2) / 2 + 0.25)
    diffs = [_diff(a, b) for a, b in zip(parallel, reference)]
    decade = max(-8, math.ceil(math.log10(max(diffs, default=FLOOR))) + 1)
    return top, (FLOOR / 3, 10.0 ** decade)


def _diff(a, b) -> float:
    if a is None or not math.isfinite(a):
        return 1e3   # a loss the run never produced or that blew up: drawn at the top
    return max(abs(a - b), FLOOR)


def _losses_key(data: tuple) -> tuple:
    parallel, reference, label, _ = data
    return (tuple(reference), label, _limits(parallel, reference))


def _losses_build(new_figure, data: tuple):
    """Axes at fixed places, the one-process curve, the tolerance line, labels and legends."""
    parallel, reference, label, _ = data
    (top_lim, bottom_lim), steps = _limits(parallel, reference), range(1, len(reference) + 1)
    fig = new_figure((7.5, 5.2))
    top = fig.add_axes((0.11, 0.40, 0.86, 0.53), xlim=(0.7, len(reference) + 0.3), ylim=top_lim)
    bottom = fig.add_axes((0.11, 0.09, 0.86, 0.25), sharex=top, yscale="log", ylim=bottom_lim)
    top.plot(steps, reference, color="#999999", linewidth=5, alpha=0.6)
    top.xaxis.set_tick_params(labelbottom=False)
    top.set_ylabel("training loss (cross-entropy)")
    top.legend(handles=[Line2D([], [], color="#999999", linewidth=5, alpha=0.6, label="one process"),
                        Line2D([], [], color="black", linestyle="--", marker="o", markersize=4,
                               label=label)], fontsize=8, loc="upper right")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.set_xlabel("step")
    bottom.set_ylabel("|parallel - one process|")
    bottom.axhline(1e-10, color="#D55E00", linestyle=":")
    bottom.text(0.99, 2e-10, "fp64 tolerance 1e-10", color="#D55E00", fontsize=8, ha="right",
                va="bottom", transform=blended_transform_factory(bottom.transAxes, bottom.transData))
    top.set_title("")
    return top, bottom


def _losses_update(fig, axes, data: tuple) -> list:
    """The parallel run's losses over the one-process curve, their distance below, the title."""
    top, bottom = axes
    parallel, reference, label, title = data
    steps = list(range(1, len(reference) + 1))
    shown = [(k, v) for k, v in zip(steps, parallel) if v is not None and math.isfinite(v)]
    drawn = top.plot(*zip(*shown), linestyle="--", marker="o", markersize=4, color="black") if shown else []
    drawn += bottom.plot(steps, [_diff(a, b) for a, b in zip(parallel, reference)], marker="o",
                         markersize=4, color="black")
    top.set_title(title, fontsize=12)
    return drawn + [top.title]


LIVE_LOSSES = LiveFigure(_losses_key, _losses_build, _losses_update)


def losses_png(parallel: list[float], reference: list[float], label: str, title: str) -> Png:
    """The loss curves of one run for the explorer (the notebook's ``plots.plot_losses``)."""
    return LIVE_LOSSES.png((parallel, reference, label, title))


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
            fig = losses_png(data["losses"]["parallel"], data["losses"]["reference"],
                             choose.value + ("" if bug.value == "none" else f" + {bug.value}"),
                             "Loss per step: the parallel run lies on the single-process curve"
                             if report.passed else "Loss per step: the curves part")
        elif view.value == "who holds what":
            fig = plot_rank_grid(data["grid"], sizes)
        else:
            fig = plot_bytes(data["bytes"])
        return [fig, capstone_summary(report)]

    return live_view([[choose, n_steps], [strategy, bug, view]], render)
