"""Gantt lanes of an emulated-link run: per rank a compute lane and a communication lane.

    fig = plot_timeline(results.timeline, title="TP MLP forward + backward")

One row per lane, one box per event (compute solid in the rank's colour, communication hatched
in it), its name inside when it fits; the names of boxes too narrow for one are listed in the
legend, left to right, so that no box goes unnamed. Times are the modelled link's (the run's
clock divided by the time scale), and the title says the link is emulated and, when stretched,
how many times slower than real time it ran.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from mtb_helpers.plots.palette import rank_color
from mtb_helpers.plots.parts import figure_axes, label_size, legend_right
from mtb_helpers.runtime.timeline import LinkTimeline

__all__ = ["plot_timeline", "LANES"]

LANES = ("compute", "comm")


def plot_timeline(timeline: LinkTimeline, title: str = "", ax: plt.Axes | None = None,
                  width: float = 10.0, unit: str = "ms") -> Figure:
    """Two lanes per rank (compute above comm), rank 0 on top, in the link's own time."""
    model = timeline.in_model_time()
    scale = {"ms": 1e3, "s": 1.0, "us": 1e6}[unit]
    p = len(model.ranks)
    fig, ax = figure_axes(ax, (width, 1.2 + 0.75 * p))
    span = max(model.makespan * scale, 1e-12)
    band = span * 0.02
    axes_inches = fig.get_figwidth() * ax.get_position().width
    ticks, labels, unnamed = [], [], []
    for r, events in enumerate(model.ranks):
        for lane, kind in enumerate(LANES):
            y = (p - 1 - r) * 2.4 + (1 - lane) * 1.0
            ticks.append(y)
            labels.append(f"rank {r} {kind}")
            for e in (e for e in events if e.kind == kind):
                start, length = e.start * scale, (e.end - e.start) * scale
                solid = kind == "compute"
                ax.add_patch(Rectangle((start, y - 0.4), length, 0.8,
                                       facecolor=rank_color(r) if solid else "white",
                                       edgecolor="black" if solid else rank_color(r),
                                       hatch=None if solid else "///", linewidth=0.8))
                points = length / (span + 2 * band) * axes_inches * 72
                size = label_size(points, e.name, 8.0)
                if size:
                    ax.text(start + length / 2, y, e.name, ha="center", va="center",
                            fontsize=size, bbox={"facecolor": "white", "edgecolor": "none",
                                                 "pad": 0.5, "alpha": 0.8})
                else:             # named in the legend instead
                    unnamed.append((start, e.name))
    ax.set_xlim(-band, span * 1.02)
    ax.set_ylim(-0.7, (p - 1) * 2.4 + 1.7)
    ax.set_yticks(ticks, labels, fontsize=8)
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
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig
