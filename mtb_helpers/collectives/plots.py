"""Figures of the collectives primer: every rank's buffer before and after, and bytes sent.

They draw plain data (a :class:`~mtb_helpers.collectives.check.CollectivesReport`, its ``to_dict()``,
or the rows of ``measure_bytes``); they never start ranks. A cell is coloured by the rank its
value came from; a complete sum over several ranks shows one band of each rank's colour.
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.legend_handler import HandlerTuple
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from mtb_helpers.plots.live import LiveFigure, Png
from mtb_helpers.plots.palette import EMPTY_COLOR, FAIL_COLOR, bands, rank_color, rank_legend_handles

WHAT_IT_DOES = {
    "broadcast": "rank 0's buffer is copied to every rank",
    "all-reduce": "every rank ends with the element-wise sum of all buffers",
    "all-gather": "every rank ends with all shards, in rank order",
    "reduce-scatter": "rank r keeps chunk r of the element-wise sum",
    "all-to-all": "chunk j of rank r goes to rank j (a transpose of the chunk grid)",
}
_COLLECTIVES = tuple(WHAT_IT_DOES)


def _text_color(face: str) -> str:
    r, g, b = to_rgb(face)
    return "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black"


def _fmt(v: float) -> str:
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.3g}"


def draw_buffers(ax, buffers: Sequence[Sequence[float]], sources: Sequence[Sequence[Sequence[int]]],
                 title: str, chunks: int = 1,
                 expected: Sequence[Sequence[float]] | None = None, min_width: int = 3) -> None:
    """Draw one row per rank (rank 0 on top) of value cells on ``ax``.

    ``sources[r][i]``: the ranks whose data is in cell i of rank r (one -> its colour, several ->
    bands, none -> grey). ``chunks``: thick separators every len/chunks cells. ``expected``: a
    cell whose value differs gets a thick dark-orange (vermillion) border and the wanted value
    underneath."""
    width = max((len(b) for b in buffers), default=1)
    size = 10 if width <= 8 else 9 if width <= 12 else 8
    show_wanted = width <= 12   # no room to write the expected value in narrower cells
    for r, (values, srcs) in enumerate(zip(buffers, sources)):
        y = len(buffers) - 1 - r
        for i, (v, src) in enumerate(zip(values, srcs)):
            colors = [rank_color(s) for s in src] or [EMPTY_COLOR]
            for band in bands(i, y, 1, 1, colors):  # one band per rank of a sum over several ranks
                ax.add_patch(band)
            wrong = expected is not None and i < len(expected[r]) and expected[r][i] != v
            ax.add_patch(Rectangle((i, y), 1, 1, fill=False, linewidth=3 if wrong else 0.8,
                                   edgecolor=FAIL_COLOR if wrong else "white", zorder=3))
            box = dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.85)
            ax.text(i + 0.5, y + (0.6 if wrong and show_wanted else 0.5), _fmt(v), ha="center", va="center",
                    fontsize=size, fontweight="bold", zorder=4,
                    color="black" if len(colors) > 1 else _text_color(colors[0]),
                    bbox=box if len(colors) > 1 else None)
            if wrong and show_wanted:
                ax.text(i + 0.5, y + 0.2, f"want {_fmt(expected[r][i])}", ha="center", va="center",
                        fontsize=max(size - 2, 7), zorder=4, color="black",
                        bbox=dict(boxstyle="square,pad=0.05", facecolor="white", edgecolor="none"))
        step = len(values) // chunks if chunks > 1 and len(values) % chunks == 0 else 0
        for c in range(1, chunks if step else 0):
            ax.plot([c * step, c * step], [y, y + 1], color="black", linewidth=2.5, zorder=5)
    pad = max(0, min_width - width) / 2  # centre a narrow buffer in a panel wide enough for its title
    ax.set_xlim(-pad, width + pad)
    ax.set_ylim(0, len(buffers))
    ax.set_yticks([len(buffers) - 0.5 - r for r in range(len(buffers))],
                  [f"rank {r}" for r in range(len(buffers))])
    step = max(1, width // 8)
    ax.set_xticks([i + 0.5 for i in range(0, width, step)], [str(i) for i in range(0, width, step)])
    ax.tick_params(length=0)
    ax.set_xlabel("element index")
    ax.set_title(title, fontsize=11)
    ax.spines[:].set_visible(False)


def _legend(fig: Figure, world_size: int, striped: bool, wrong: bool) -> None:
    handles: list = rank_legend_handles(world_size)
    if striped:   # bands, not a hatch: in the course a hatch means a partial sum (notebooks 01-03)
        handles.append(tuple(Patch(facecolor=rank_color(r), edgecolor="none") for r in range(world_size)))
    if wrong:
        handles.append(Patch(facecolor="white", edgecolor=FAIL_COLOR, linewidth=2.5))
    labels = [f"rank {r}" for r in range(world_size)] + \
        ["a complete sum: one band per rank added"] * striped + ["wrong value (thick dark-orange border)"] * wrong
    fig.legend(handles=handles, labels=labels, handler_map={tuple: HandlerTuple(ndivide=None, pad=0)},
               loc="lower center", ncol=len(handles) if len(handles) <= 5 else 3, fontsize=9,
               frameon=False, bbox_to_anchor=(0.5, 0.0))


def _collective_data(report, collective: str) -> tuple:
    data = report.to_dict() if hasattr(report, "to_dict") else report
    rows = [v for v in data["values"] if v["collective"] == collective]
    if not rows:
        raise ValueError(f"the report has no rows for {collective!r}")
    return collective, rows


def _collective_key(data) -> tuple:
    """Every value drawn: the buffers are the picture (only the verdict line is drawn over it)."""
    collective, rows = data
    return (collective, tuple((tuple(r["before"]), tuple(r["after"]), tuple(r["expected"]),
                               tuple(map(tuple, r["sources"]))) for r in rows))


def _build_collective(new_figure, data):
    """The static layer: both panels of buffers, the legend."""
    collective, rows = data
    t = len(rows)
    n_before, n_after = len(rows[0]["before"]), len(rows[0]["after"])
    fig = new_figure((min(10, 2.2 + 0.55 * (max(n_before, 3) + max(n_after, 3))), 1.9 + 0.55 * t))
    grid = fig.add_gridspec(1, 2, width_ratios=[max(n_before, 3), max(n_after, 3)], wspace=0.25)
    ax_b, ax_a = fig.add_subplot(grid[0]), fig.add_subplot(grid[1])
    # Thick lines mark the chunks (n/p bytes each) wherever a chunk is the unit that moves.
    chunks_before = t if collective in ("reduce-scatter", "all-to-all") else 1
    chunks_after = t if collective in ("all-gather", "all-to-all") else 1
    draw_buffers(ax_b, [r["before"] for r in rows], [[[r["rank"]]] * n_before for r in rows],
                 "before", chunks=chunks_before)
    draw_buffers(ax_a, [r["after"] for r in rows], [r["sources"] for r in rows],
                 f"after {collective}", chunks=chunks_after, expected=[r["expected"] for r in rows])
    ax_a.set_yticklabels([])
    striped = any(len(s) > 1 for r in rows for s in r["sources"])
    wrong = not all(r["after"] == r["expected"] for r in rows)
    _legend(fig, t, striped, wrong)
    fig.subplots_adjust(top=1 - 0.75 / fig.get_figheight(), bottom=0.95 / fig.get_figheight(),
                        left=0.9 / fig.get_figwidth(), right=0.98)
    fig.suptitle("", fontsize=11)   # the verdict: set by every update


def _update_collective(fig: Figure, _, data) -> list:
    """The value drawn over the buffers: the verdict of this run."""
    collective, rows = data
    t = len(rows)
    verdict = "matches" if all(r["passed"] for r in rows) else "DIFFERS from"
    fig.suptitle(f"{collective} on {t} rank{'s' * (t > 1)}: {WHAT_IT_DOES[collective]}\n"
                 f"(result {verdict} the single-process reference)", fontsize=11)
    return [fig._suptitle]


LIVE_COLLECTIVE = LiveFigure(_collective_key, _build_collective, _update_collective)


def plot_collective(report, collective: str) -> Figure:
    """Every rank's buffer before and after ``collective``, from a check report (or its dict).

    One row per rank; a cell's colour is the rank its value came from; thick lines separate the
    chunks of n/p bytes; a value that differs from the single-process reference has a dark-orange border."""
    return LIVE_COLLECTIVE.figure(_collective_data(report, collective))


def collective_png(report, collective: str) -> Png:
    """``plot_collective`` for an explorer: the buffers drawn once per set of values, the
    verdict on every redraw."""
    return LIVE_COLLECTIVE.png(_collective_data(report, collective))


def plot_bytes(rows: Sequence[dict]) -> Figure:
    """Bytes each rank sends (÷ n, the full tensor's bytes) against the number of ranks p: measured
    dots (rank colours) on the formula line, one panel per collective. ``rows`` come from
    ``measure_bytes``."""
    collectives = [c for c in _COLLECTIVES if any(r["collective"] == c for r in rows)]
    sizes = sorted({r["world_size"] for r in rows})
    fig, axes = plt.subplots(1, len(collectives), figsize=(10, 3.9), sharey=True, squeeze=False)
    V = rows[0]["V_bytes"]
    for ax, name in zip(axes[0], collectives):
        mine = [r for r in rows if r["collective"] == name]
        formula = [max(r["formula"] for r in mine if r["world_size"] == t) / V for t in sizes]
        ax.plot(sizes, formula, "k-", label=FORMULA_LABEL[name])
        if name == "broadcast":
            ax.plot(sizes, [1 if t > 1 else 0 for t in sizes], "k:", label="pipelined ring: n")
        if name == "reduce-scatter":  # gloo has no ring reduce-scatter: it all-reduces inside
            ax.plot(sizes, [2 * (t - 1) / t for t in sizes], "k:", label="2(p-1)/p·n (gloo)")
        for r in mine:
            if r["measured"] is not None:
                x = r["world_size"] + 0.1 * (r["rank"] - (r["world_size"] - 1) / 2)
                ax.plot(x, r["measured"] / V, "o", color=rank_color(r["rank"]),
                        markeredgecolor="black", markersize=6, zorder=3)
        ax.set_title(name, fontsize=11)
        ax.set_xticks(sizes)
        ax.set_xlabel("ranks p")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8.5, loc="upper left", frameon=True, framealpha=0.9,
                  handlelength=1.5)
    axes[0][0].set_ylabel("bytes sent by a rank / n")
    axes[0][0].set_ylim(-0.1, 2.6)
    handles = [Line2D([], [], marker="o", linestyle="", color=rank_color(r), markeredgecolor="black",
                      label=f"rank {r}, measured") for r in range(max(sizes))]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=9, frameon=False)
    fig.suptitle(f"Bytes each rank sends: measured on gloo (dots) vs the formula (lines); "
                 f"n = {V:,} B, the full tensor", fontsize=11)
    fig.subplots_adjust(top=0.86, bottom=0.25, left=0.07, right=0.99, wspace=0.1)
    return fig


FORMULA_LABEL = {
    "broadcast": "tree root: ⌈log2 p⌉·n",
    "all-reduce": "ring: 2(p-1)/p·n",
    "all-gather": "ring: (p-1)/p·n",
    "reduce-scatter": "ring: (p-1)/p·n",
    "all-to-all": "(p-1)/p·n",
}


def plot_decomposition(result: dict) -> Figure:
    """Input -> reduce-scatter -> all-gather, next to all-reduce's answer, from the dict of
    ``all_reduce_as_reduce_scatter_all_gather``: one row per rank in each panel."""
    ranks = result["ranks"]
    t = len(ranks)
    everyone = list(range(t))
    n, shard = len(ranks[0]["input"]), len(ranks[0]["reduce_scatter"])
    fig, axes = plt.subplots(1, 3, figsize=(10, 1.9 + 0.55 * t), gridspec_kw={
        "width_ratios": [n, max(shard, 3), n], "wspace": 0.2})
    draw_buffers(axes[0], [r["input"] for r in ranks], [[[r["rank"]]] * n for r in ranks],
                 "input x", chunks=t)
    draw_buffers(axes[1], [r["reduce_scatter"] for r in ranks], [[everyone] * shard] * t,
                 "1. reduce-scatter")
    axes[1].set_xlabel("index within chunk r of the sum")   # rank r holds elements r·n/p onwards
    draw_buffers(axes[2], [r["then_all_gather"] for r in ranks], [[everyone] * n] * t,
                 "2. all-gather of the shards", chunks=t,
                 expected=[r["all_reduce"] for r in ranks])
    for ax in axes[1:]:
        ax.set_yticklabels([])
    same = "equals" if result["passed"] else "DIFFERS from"
    fig.suptitle(f"all-reduce = reduce-scatter, then all-gather ({t} ranks): the result {same} "
                 f"all_reduce(x) on every rank", fontsize=11)
    _legend(fig, t, striped=True, wrong=not result["passed"])
    fig.subplots_adjust(top=1 - 0.6 / fig.get_figheight(), bottom=0.95 / fig.get_figheight(),
                        left=0.08, right=0.99)
    return fig
