"""The pieces several topics' figures share, each written once.

The figure of an optional Axes, a legend right of the axes, a stacked bar, the size of a label
that must fit in a box, a log axis whose floor reads "0 (exact)", and a failing label drawn
again in red over an explorer's static layer.

A topic's ``plots.py`` draws what is its own (a shard layout, a Gantt chart, a routing diagram)
and calls these for the rest.
"""
from __future__ import annotations

import math
from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.text import Text
from matplotlib.ticker import NullLocator

from mtb_helpers.plots.palette import FAIL_COLOR

__all__ = ["figure_axes", "legend_right", "stacked_bar", "label_size", "exact_log_axis", "fail_copy"]


def figure_axes(ax: Axes | None, figsize: tuple[float, float]) -> tuple[Figure, Axes]:
    """``(ax.figure, ax)`` when drawing into a given Axes, else a new figure ``figsize`` inches
    with one Axes."""
    if ax is not None:
        return ax.figure, ax
    fig = plt.figure(figsize=figsize)
    return fig, fig.add_subplot()


def legend_right(target: Axes | Figure, handles: list | None = None, x: float = 1.01,
                 fontsize: float = 8, **options) -> Legend:
    """A legend whose top left corner sits just right of ``target``'s top right corner (``x`` in
    axes fractions), outside the data: nothing drawn hides under it. ``handles=None``: the
    labelled artists, as ``Axes.legend`` finds them."""
    return target.legend(handles=handles, loc="upper left", bbox_to_anchor=(x, 1.0),
                         fontsize=fontsize, **options)


def stacked_bar(ax: Axes, x: float, parts: Sequence[tuple[float, dict]], width: float,
                total: float | None = None, **style) -> float:
    """One bar at ``x`` built from ``parts``, bottom first: ``(height, options)``, each part drawn
    with ``style`` and its own ``options`` (colour, hatch); ``total``, what a formula or model
    predicts, as a black tick across the bar. Returns the height of the top."""
    bottom = 0
    for height, options in parts:
        ax.bar(x, height, width, bottom=bottom, **style, **options)
        bottom += height
    if total is not None:
        ax.plot([x - width / 2, x + width / 2], [total, total], color="black", linewidth=2.5)
    return bottom


def label_size(points: float, text: str, most: float, pad: float = 0.3,
               least: float = 5.0) -> float | None:
    """The font size at which ``text``'s longest line fills a box ``points`` wide (a character is
    ~0.62 of the font size wide, ``pad`` font sizes of margin), at most ``most``; None below
    ``least`` points: too small to read is worse than no label."""
    longest = max(len(line) for line in text.split("\n"))
    size = min(most, points / (0.62 * longest + pad))
    return size if size >= least else None


def exact_log_axis(ax: Axes, floor: float, top: float, ticks: int = 7, clear: int = 0) -> None:
    """A log y axis from ``floor / 3`` to ``top`` (both whole decades) with ``floor`` labelled
    "0 (exact)": an exact zero is drawn there, and a reader must not take it for 1e-17. At most
    ``ticks`` decades are labelled above it, counting down from ``top``; the ``clear`` decades
    right above the floor stay unlabelled (room for its label)."""
    lo, hi = round(math.log10(floor)), round(math.log10(top))
    stride = max(1, math.ceil((hi - lo) / ticks))
    exps = list(range(hi, lo + clear, -stride))[::-1]
    ax.set_ylim(floor / 3, top)
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_yticks([floor] + [10.0 ** k for k in exps], ["0 (exact)"] + [f"1e{k}" for k in exps])


def fail_copy(fig: Figure, label: Text) -> Text:
    """``label`` (a tick label or a text of the static layer) drawn again in the fail colour on
    top of it: an explorer keeps the static layer's black text as pixels, so a failing one is
    drawn over it as a value artist."""
    return fig.add_artist(Text(
        *label.get_position(), label.get_text(), transform=label.get_transform(),
        rotation=label.get_rotation(), ha=label.get_ha(), va=label.get_va(),
        rotation_mode=label.get_rotation_mode(), fontsize=label.get_fontsize(),
        color=FAIL_COLOR, clip_on=False))
