"""The capstone's figures: who holds what, the loss curves against one process, how two correct
runs drift apart; the bytes each rank sends per step by group are notebook 08's ``plot_bytes``.

They draw plain data (a report's ``extra`` parts); rank r in ``rank_color(r)``. The loss curves
are one two-layer figure (``plots.live.LiveFigure``) for the notebook (``plot_losses``) and the
explorer (``losses_png``): a move redraws only the parallel runs' points.
"""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from mtb_helpers.plots.live import LiveFigure, Png
from mtb_helpers.plots.palette import rank_color, rank_legend_handles
from mtb_helpers.grid.plots import plot_bytes
from mtb_helpers.plots.parts import exact_log_axis, legend_right

__all__ = ["plot_rank_grid", "plot_losses", "losses_png", "prepare_losses", "LIVE_LOSSES", "plot_bytes",
           "plot_drift"]

def plot_rank_grid(grid: list[dict], sizes: dict[str, int]) -> Figure:
    """One box per rank: columns are pipeline stages, rows the (dp, cp, tp) coordinates; each box
    says which blocks, heads, positions and sequences the rank holds."""
    pp = sizes["pp"]
    rows = len(grid) // pp
    # room for the row labels on the left and the legend on the right, whatever pp is
    fig, ax = plt.subplots(figsize=(max(2.8 * pp, 3.6) + 3.2, 0.95 * rows + 1.3))
    for cell in grid:
        col = cell["pp"]
        row = (cell["dp"] * sizes["cp"] + cell["cp"]) * sizes["tp"] + cell["tp"]
        y = rows - 1 - row
        ax.add_patch(Rectangle((col + 0.04, y + 0.06), 0.92, 0.88, facecolor=rank_color(cell["rank"]),
                               alpha=0.35, edgecolor=rank_color(cell["rank"]), linewidth=2))
        parts = (["embed"] if cell["embedding"] else []) + [
            f"blocks {cell['blocks'][0]}-{cell['blocks'][1] - 1}"] + (["head"] if cell["head"] else [])
        text = (f"rank {cell['rank']}: {' + '.join(parts)}\n"
                f"heads {cell['heads'][0]}-{cell['heads'][1] - 1}, "
                f"pos {cell['positions'][0]}-{cell['positions'][1] - 1}, "
                f"seqs {cell['sequences'][0]}-{cell['sequences'][1] - 1}")
        ax.text(col + 0.5, y + 0.5, text, ha="center", va="center", fontsize=8)
    ax.set_xlim(0, pp)
    ax.set_ylim(0, rows)
    ax.set_xticks([c + 0.5 for c in range(pp)], [f"stage {c}" for c in range(pp)])
    ax.set_yticks([rows - 1 - r + 0.5 for r in range(rows)],
                  [f"dp {r // (sizes['cp'] * sizes['tp'])} cp {(r // sizes['tp']) % sizes['cp']} "
                   f"tp {r % sizes['tp']}" for r in range(rows)])
    ax.set_xlabel("pipeline stage (pp)")
    ax.set_ylabel("data / context / tensor coordinate")
    ax.set_title(f"Who holds what: tp={sizes['tp']} pp={pp} dp={sizes['dp']} cp={sizes['cp']} "
                 f"({len(grid)} ranks)")
    legend_right(ax, rank_legend_handles(len(grid)), x=1.0, title="rank")
    fig.tight_layout()
    return fig


FLOOR = 1e-17   # an exact 0 is drawn here on the log scale
TOLERANCE_LINE = 1e-10
MARKERS = "os^Dvx*P"
DEFAULT_TITLE = "Loss per step: the parallel run lies on the single-process curve"


def _shown(losses) -> bool:
    return losses is not None and math.isfinite(losses)


def _diff(a, b) -> float:
    if not _shown(a):
        return 1e3   # a loss the run never produced or that blew up: drawn at the top
    return max(abs(a - b), FLOOR)


def _limits(runs: tuple, reference: tuple) -> tuple:
    """The static layer's y limits: the one-process curve's (widened in steps of 0.5 when a run
    leaves them); the error axis two decades above the largest error (room for its legend)."""
    lo, hi = min(reference), max(reference)
    pad = max(0.08 * (hi - lo), 0.05)
    top = (lo - pad, hi + pad)
    finite = [v for _, losses in runs for v in losses if _shown(v)]
    if finite and (min(finite) < top[0] or max(finite) > top[1]):
        top = (math.floor(min(lo, *finite) * 2) / 2 - 0.25, math.ceil(max(hi, *finite) * 2) / 2 + 0.25)
    diffs = [_diff(a, b) for _, losses in runs for a, b in zip(losses, reference)]
    decade = max(-8, math.ceil(math.log10(max(diffs, default=FLOOR))) + 2)
    return top, (FLOOR / 3, 10.0 ** decade)


def _style(i: int) -> dict:
    return {"marker": MARKERS[i % len(MARKERS)], "markersize": 4,
            "color": "black" if i == 0 else f"C{i}"}


def _losses_key(data: tuple) -> tuple:
    runs, reference, title = data
    return (reference, tuple(name for name, _ in runs), _limits(runs, reference), title)


def _losses_build(new_figure, data: tuple):
    """Everything but the parallel runs' points: axes at fixed places (no layout pass), the
    one-process curve, the tolerance line, labels, legends and the title."""
    runs, reference, title = data
    (top_lim, bottom_lim), steps = _limits(runs, reference), range(1, len(reference) + 1)
    fig = new_figure((7.5, 5.2))
    top = fig.add_axes((0.14, 0.40, 0.83, 0.53), xlim=(0.7, len(reference) + 0.3), ylim=top_lim)
    bottom = fig.add_axes((0.14, 0.09, 0.83, 0.25), sharex=top, yscale="log", ylim=bottom_lim)
    top.plot(steps, reference, color="#999999", linewidth=5, alpha=0.6)
    top.xaxis.set_tick_params(labelbottom=False)
    top.set_ylabel("training loss (cross-entropy)")
    top.legend(handles=[Line2D([], [], color="#999999", linewidth=5, alpha=0.6, label="one process")]
               + [Line2D([], [], linestyle="--", label=name, **_style(i))
                  for i, (name, _) in enumerate(runs)], fontsize=8, loc="upper right")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.set_xlabel("step")
    bottom.set_ylabel("|parallel - one process|")
    exact_log_axis(bottom, FLOOR, bottom_lim[1], ticks=5, clear=1)   # as the error figures
    bottom.axhline(TOLERANCE_LINE, color="#D55E00", linestyle=":", label="fp64 tolerance 1e-10")
    bottom.legend(fontsize=8, loc="upper left")
    top.set_title(title, fontsize=12)
    return top, bottom


def _losses_update(fig: Figure, axes: tuple, data: tuple) -> list:
    """Each parallel run's losses over the one-process curve and their distance below."""
    top, bottom = axes
    runs, reference, _ = data
    steps = list(range(1, len(reference) + 1))
    drawn = []
    for i, (_, losses) in enumerate(runs):
        shown = [(k, v) for k, v in zip(steps, losses) if _shown(v)]
        if shown:
            drawn += top.plot(*zip(*shown), linestyle="--", **_style(i))
        drawn += bottom.plot(steps, [_diff(a, b) for a, b in zip(losses, reference)], **_style(i))
    return drawn


LIVE_LOSSES = LiveFigure(_losses_key, _losses_build, _losses_update)


def losses_data(parallel: list, reference: list, label: str = "parallel",
                others: dict[str, list] | None = None, title: str = "") -> tuple:
    """What ``LIVE_LOSSES`` draws: ``(((name, losses), ...), reference, title)``, lists as tuples
    (a missing or non-finite loss: left out above, drawn at the top below)."""
    runs = ((label, tuple(parallel)),) + tuple((k, tuple(v)) for k, v in (others or {}).items())
    return runs, tuple(reference), title or DEFAULT_TITLE


def plot_losses(parallel: list[float], reference: list[float], label: str = "parallel",
                others: dict[str, list[float]] | None = None, title: str = "") -> Figure:
    """The loss per step: one process (thick grey) under the parallel run(s) (markers); below,
    ``|parallel - one process|`` on a log scale. The explorer draws the same figure
    (``losses_png``): one build and one update, ``LIVE_LOSSES``."""
    return LIVE_LOSSES.figure(losses_data(parallel, reference, label, others, title))


def losses_png(parallel: list[float], reference: list[float], label: str = "parallel",
               others: dict[str, list[float]] | None = None, title: str = "") -> Png:
    """``plot_losses`` as PNG for an explorer (the static layer drawn once per reference)."""
    return LIVE_LOSSES.png(losses_data(parallel, reference, label, others, title))


def prepare_losses(reference: list[float], label: str = "parallel") -> None:
    """Render and keep the static layer ``losses_png`` draws a correct run ``label`` over (its
    points lie on the one-process curve): an explorer makes it while its ranks start."""
    LIVE_LOSSES.prepare(losses_data(reference, reference, label))


def plot_drift(drift: dict, title: str = "") -> Figure:
    """Largest parameter error per step on a log scale: the parallel run against one process
    running on its own (free: rounding compounds through AdamW) and against one process
    re-anchored on the parallel run's state before each step (each step judged alone).
    ``drift`` is a capstone report's ``extra["drift"]``; zeros are drawn on the "0 (exact)" line."""
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    steps = drift["steps"]
    floor = lambda values: [max(v, FLOOR) if v is not None else float("nan") for v in values]  # noqa: E731
    for kind, style, label in (("free", "-o", "free-running: the two runs drift apart"),
                               ("anchored", "--s", "re-anchored before each step")):
        ax.semilogy(steps, floor(drift[kind]["params"]), style, color="black" if kind == "free"
                    else "#777777", markersize=4, label=label)
    ax.axhline(drift["tolerance"]["params"], color="#D55E00", linestyle=":",
               label=f"the check's tolerance {drift['tolerance']['params']:.0e}")
    highest = max([drift["tolerance"]["params"]] + [v for kind in ("free", "anchored")
                                                    for v in drift[kind]["params"] if v is not None])
    exact_log_axis(ax, FLOOR, 10.0 ** (math.ceil(math.log10(highest)) + 1), ticks=5, clear=1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("largest parameter error\nvs one process")
    ax.set_title(title or "Rounding compounds through AdamW; each step on its own agrees")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig
