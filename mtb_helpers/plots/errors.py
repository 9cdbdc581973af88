"""The error-per-quantity figure every check shares (tp, sp, dp, grid, cp, moe, attention, vocab).

Max abs error per rank against the tolerance on a log scale, one column per step of the trace or
per quantity of the report; a point in the rank's colour, framed red when it fails; a red cross
at the top for a tensor a rank never produced; an exact 0 on the "0 (exact)" line at the bottom;
the column of a failing step or quantity shaded red. One code path for the notebooks' figure
(``plot_errors``) and the explorers' (``LIVE_ERRORS.png``): the axes, ticks and legend are the
static layer, the points, tolerances and verdict the values drawn over it (``plots/live.py``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from matplotlib.axes import Axes
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from mtb_helpers.plots.live import LiveFigure, Png
from mtb_helpers.plots.palette import FAIL_COLOR, PASS_COLOR, rank_color, rank_legend_handles
from mtb_helpers.plots.parts import exact_log_axis, fail_copy, legend_right

__all__ = ["ErrorColumn", "ErrorFigure", "error_figure", "plot_errors", "errors_png", "LIVE_ERRORS"]

FIGSIZE = (10.0, 4.2)


@dataclass(frozen=True)
class ErrorColumn:
    """One position on the x axis: its label, its tolerance and its points, each
    ``(rank, max abs error or None when the rank never produced it, passed)``."""
    label: str
    tolerance: float
    points: tuple[tuple[int, float | None, bool], ...]

    @property
    def passed(self) -> bool:
        return all(ok for _, _, ok in self.points)


@dataclass(frozen=True)
class ErrorFigure:
    """What the figure shows: the columns, the world size, the title and the x axis' name."""
    columns: tuple[ErrorColumn, ...]
    world_size: int
    title: str
    xlabel: str

    def limits(self) -> tuple[float, float]:
        """(floor, top), whole decades: two decades under the smallest nonzero error or
        tolerance (the "0 (exact)" line), one over the largest."""
        finite = [e for c in self.columns for _, e, _ in c.points if e] + [
            c.tolerance for c in self.columns]
        return (10 ** math.floor(math.log10(min(finite)) - 2),
                10 ** math.ceil(math.log10(max(finite)) + 1))

    def key(self) -> tuple:
        """What the static layer depends on (the values and the verdict are drawn over it)."""
        return (tuple(c.label for c in self.columns), self.world_size, self.limits(), self.xlabel)


def error_figure(report, by: str = "step", group: Callable[[str], str] | None = None,
                 title: str | None = None, xlabel: str | None = None) -> ErrorFigure:
    """The columns of ``report``: ``by="step"``, one per step of its trace; ``by="quantity"``,
    one per report row quantity, or per ``group(quantity)`` (MoE: an expert's four grads)."""
    if by == "step":
        columns = [ErrorColumn(f"{s.index}. {s.name}", s.tolerance, tuple(
            (r, h.max_abs_err, h.passed) for r, h in enumerate(s.holdings))) for s in report.steps]
    elif by == "quantity":
        grouped: dict[str, list] = {}
        for row in report.rows:
            grouped.setdefault(group(row.quantity) if group else row.quantity, []).append(row)
        columns = [ErrorColumn(label, max(r.tolerance for r in rows), tuple(
            (r.rank, None if math.isinf(r.max_abs_err) else r.max_abs_err, r.passed)
            for r in rows)) for label, rows in grouped.items()]
    else:
        raise ValueError(f"by must be 'step' or 'quantity', got {by!r}")
    t = 1 + max(rank for c in columns for rank, _, _ in c.points)
    verdict = "passed" if report.passed else "FAILED"
    title = title or (f"{report.check} ({report.config.get('dtype')}, {t} rank{'s' * (t > 1)}): "
                      f"error per {by}, {verdict}")
    return ErrorFigure(tuple(columns), t, title,
                       xlabel or ("step of the trace" if by == "step" else "quantity"))


def _build(new_figure, data: ErrorFigure) -> Axes:
    """The static layer: axes, log scale between whole decades, ticks, labels, legend. Margins
    are set from the label lengths, so no layout pass measures the text."""
    labels = [c.label for c in data.columns]
    slant = any(". " in s for s in labels) or len(labels) > 6  # long names run together
    # slanted 35 degrees, a label of n characters at 8 pt reaches ~0.045 n in left of its tick
    # and ~0.032 n in down; the y label and "0 (exact)" need ~1.05 in on the left
    longest = max((len(s) for s in labels), default=1)
    bottom_in = 0.5 + (0.032 * longest + 0.1 if slant else 0.15)
    left_in = max(1.05, 0.045 * len(labels[0]) - 0.3) if slant else 1.05
    fig = new_figure(FIGSIZE)
    ax = fig.add_axes((left_in / FIGSIZE[0], bottom_in / FIGSIZE[1], 8.25 / FIGSIZE[0] - left_in / FIGSIZE[0],
                       1 - (bottom_in + 0.4) / FIGSIZE[1]))
    floor, top = data.limits()
    ax.set_yscale("log")
    ax.set_xlim(-0.6, len(labels) - 0.4)
    exact_log_axis(ax, floor, top)
    ax.axhline(floor, color="grey", linestyle=":", linewidth=1)
    ax.set_xticks(range(len(labels)), labels, rotation=35 if slant else 0,
                  ha="right" if slant else "center", fontsize=8)
    ax.set_ylabel("max abs error vs one process")
    ax.set_xlabel(data.xlabel)
    # outside the axes: failing points sit high up, exactly where an inside legend would go
    legend_right(ax, [*rank_legend_handles(data.world_size),
                      Line2D([], [], color="black", linewidth=1.5, label="tolerance"),
                      Line2D([], [], marker="o", linestyle="", markerfacecolor="white",
                             markeredgecolor=FAIL_COLOR, markeredgewidth=2, label="fails"),
                      Line2D([], [], marker="X", linestyle="", color=FAIL_COLOR, label="missing")])
    return ax


def _update(fig: Figure, ax: Axes, data: ErrorFigure) -> list:
    """The values: tolerances, one scatter per (rank, marker, verdict), red columns and labels,
    the title with the verdict."""
    floor, top = data.limits()
    t = data.world_size
    drawn: list = [ax.add_collection(LineCollection(
        [[(i - 0.4, c.tolerance), (i + 0.4, c.tolerance)] for i, c in enumerate(data.columns)],
        colors="black", linewidths=1.5, zorder=2))]
    points: dict[tuple, list] = {}   # (rank, missing, passed) -> [(x, y)]
    for i, column in enumerate(data.columns):
        spread = len({r for r, _, _ in column.points}) > 1   # an expert's grads: one rank, centred
        for rank, err, ok in column.points:
            x = i + (rank - (t - 1) / 2) * 0.6 / max(t, 2) if spread else i
            y = top / 3 if err is None else max(err, floor)
            points.setdefault((rank, err is None, ok), []).append((x, y))
        if not column.passed:   # the whole column of a failing step or quantity turns red
            drawn.append(ax.axvspan(i - 0.5, i + 0.5, color=FAIL_COLOR, alpha=0.12, linewidth=0))
    for (rank, missing, ok), xy in sorted(points.items()):
        drawn.append(ax.scatter(*zip(*xy), s=60, color=rank_color(rank),
                                marker="X" if missing else "o", zorder=3,
                                edgecolor=PASS_COLOR if ok else FAIL_COLOR,
                                linewidth=0.5 if ok else 2.0))
    for tick, column in zip(ax.get_xticklabels(), data.columns):
        tick.set_color("black" if column.passed else FAIL_COLOR)
        if not column.passed:   # drawn over the static black label in an explorer
            drawn.append(fail_copy(fig, tick))
    ax.set_title(data.title, fontsize=11)
    return drawn + [ax.title]


LIVE_ERRORS = LiveFigure(ErrorFigure.key, _build, _update)


def plot_errors(report, by: str = "step") -> Figure:
    """Max abs error per rank on a log scale against the tolerance, red where it fails.

    ``by="step"``: one position per step of the trace; ``by="quantity"``: one per report row
    quantity (forward output, input grad, ...). An exact 0 is drawn on the "0" line at the
    bottom; a tensor a rank never produced is drawn as a red cross at the top.
    """
    return LIVE_ERRORS.figure(error_figure(report, by))


def errors_png(report, by: str = "step", **figure) -> Png:
    """``plot_errors`` for an explorer, as PNG: axes, ticks and legend drawn once per set of
    columns, the points and the verdict on every redraw. ``figure``: ``error_figure``'s options."""
    return LIVE_ERRORS.png(error_figure(report, by, **figure))
