"""Gantt lanes of an emulated-link run: per rank a compute lane and a communication lane.

    fig = plot_timeline(results.timeline, title="TP MLP forward + backward")

One row per lane, one box per event (compute solid in the rank's colour, communication hatched
in it), its name inside when it fits; the names of boxes too narrow for one are listed in the
legend, left to right, so that no box goes unnamed. Times are the modelled link's (the run's
clock divided by the time scale), and the title says the link is emulated and, when stretched,
how many times slower than real time it ran. ``draw_lanes`` draws the lanes of notebook 14's
figures too.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from mtb_helpers.plots.palette import rank_color
from mtb_helpers.plots.parts import figure_axes, label_size, legend_right
from mtb_helpers.runtime.timeline import LinkTimeline

__all__ = ["plot_timeline", "draw_lanes", "LANES"]

LANES = ("compute", "comm")


def draw_lanes(ax: plt.Axes, rows: list[tuple[str, str, list[tuple]]], span: float,
               most: float = 8.0) -> list[tuple[float, str]]:
    """Two lanes per row, the first row on top: compute (solid, in the row's colour) above comm
    (white, hatched in it). ``rows``: ``(name, colour, boxes)``, each box ``(kind, start, end,
    label, hatch)`` in the x axis' unit, ``span`` the time the axis shows. A label is written in
    its box when it fits (at most ``most`` points); returns ``(start, label)`` of those that do
    not, for a legend."""
    band = span * 0.02
    ax.set_xlim(-band, span + band)
    points = ax.figure.get_figwidth() * ax.get_position().width * 72 / (span + 2 * band)
    ticks, names, unnamed = [], [], []
    for i, (name, color, boxes) in enumerate(rows):
        for lane, kind in enumerate(LANES):
            y = (len(rows) - 1 - i) * 2.4 + (1 - lane) * 1.0
            ticks.append(y)
            names.append(f"{name} {kind}")
            for start, end, text, hatch in ((b[1], b[2], b[3], b[4]) for b in boxes if b[0] == kind):
                solid = kind == "compute"
                ax.add_patch(Rectangle((start, y - 0.4), end - start, 0.8,
                                       facecolor=color if solid else "white",
                                       edgecolor="black" if solid else color,
                                       hatch=None if solid else hatch, linewidth=0.8))
                size = label_size((end - start) * points, text, most) if text else None
                if size:
                    ax.text((start + end) / 2, y, text, ha="center", va="center",
                            fontsize=size, bbox={"facecolor": "white", "edgecolor": "none",
                                                 "pad": 0.5, "alpha": 0.8})
                elif text:
                    unnamed.append((start, text))
    ax.set_ylim(-0.7, (len(rows) - 1) * 2.4 + 1.7)
    ax.set_yticks(ticks, names, fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    return unnamed


def plot_timeline(timeline: LinkTimeline, title: str = "", ax: plt.Axes | None = None,
                  width: float = 10.0, unit: str = "ms") -> Figure:
    """Two lanes per rank (compute above comm), rank 0 on top, in the link's own time."""
    model = timeline.in_model_time()
    scale = {"ms": 1e3, "s": 1.0, "us": 1e6}[unit]
    fig, ax = figure_axes(ax, (width, 1.2 + 0.75 * len(model.ranks)))
    span = max(model.makespan * scale, 1e-12)
    unnamed = draw_lanes(ax, [(f"rank {r}", rank_color(r), [
        (e.kind, e.start * scale, e.end * scale, e.name, "///") for e in events])
        for r, events in enumerate(model.ranks)], span)
    stretched = f"; the run took {timeline.time_scale:g}× longer" if timeline.time_scale != 1 else ""
    shown = "µs" if unit == "us" else unit
    ax.set_xlabel(f"time ({shown} of the modelled link{stretched})")
    head = f"{title}\n" if title else ""
    ax.set_title(f"{head}{timeline.label()}: makespan {span:.3g} {shown}", fontsize=10)
    handles = [Patch(facecolor="#999999", edgecolor="black", label="compute (padded)"),
               Patch(facecolor="white", edgecolor="#555555", hatch="///", label="communication")]
    if unnamed:           # each name once, in the order the boxes start
        names = list(dict.fromkeys(name for _, name in sorted(unnamed)))
        handles.append(Patch(facecolor="none", edgecolor="none",
                             label="narrow boxes, left to right:\n" + ", ".join(names)))
    legend_right(ax, handles, framealpha=0.9)
    fig.tight_layout()
    return fig
