"""The planner's figures, from plain numbers: memory per rank as stacked bars (one bar per pipeline
stage, or per step of a walk-through) against the GPU's memory, and where a step's time goes for
the fastest layouts. The series are memory terms and time causes, not ranks, so they take Paul
Tol's colour-blind-safe "muted" scheme instead of the rank palette (which stays for ranks)."""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from mtb_helpers.plan.budget import MEMORY_TERMS, StageMemory
from mtb_helpers.plan.presets import GIB
from mtb_helpers.plots.parts import figure_axes, legend_right

__all__ = ["TERM_COLORS", "plot_stacked_memory", "plot_stage_memory", "plot_step_times",
           "plot_against_gpu"]

_MUTED = ("#332288", "#88CCEE", "#44AA99", "#117733", "#999933", "#DDCC77", "#CC6677",
          "#882255", "#AA4499", "#DDDDDD")
TERM_COLORS = dict(zip(MEMORY_TERMS + ("layer input",), _MUTED))
TIME_COLORS = dict(zip(("compute", "tensor parallel", "context parallel", "expert parallel",
                        "pipeline bubble and p2p", "data parallel"), _MUTED))


def plot_stacked_memory(columns: Sequence[tuple[str, dict[str, float]]], limit: float | None = None,
                        title: str = "Memory per rank", xlabel: str = "",
                        ax=None) -> Figure:
    """One stacked bar per ``(label, {term: bytes})``, in GiB; ``limit`` (bytes) drawn as a line."""
    fig, ax = figure_axes(ax, (9, 4.2))
    terms = [t for t in TERM_COLORS if any(c[1].get(t, 0) for c in columns)]
    bottoms = [0.0] * len(columns)
    for term in terms:
        heights = [c[1].get(term, 0.0) / GIB for c in columns]
        ax.bar(range(len(columns)), heights, width=0.6, bottom=bottoms, color=TERM_COLORS[term],
               edgecolor="black", linewidth=0.4, label=term)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    for i, total in enumerate(bottoms):
        ax.text(i, total, f"{total:.1f}", ha="center", va="bottom", fontsize=8)
    if limit is not None:
        ax.axhline(limit / GIB, color="black", linestyle="--", linewidth=1)
        ax.text(max(len(columns), 3) - 0.55, limit / GIB, f"GPU memory {limit / GIB:.0f} GiB",
                va="bottom", ha="right", fontsize=8,
                bbox=dict(facecolor="white", edgecolor="none", pad=1))
    ax.set_xlim(-0.5, max(len(columns), 3) - 0.5)
    ax.set_xticks(range(len(columns)))
    ax.set_xticklabels([c[0] for c in columns], fontsize=8)
    ax.set_ylabel("GiB per rank")
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    top = max(bottoms + [limit / GIB if limit else 0.0])
    ax.set_ylim(0, top * 1.15 if top > 0 else 1)
    legend_right(ax, fontsize=7, title="held for", title_fontsize=8)
    if ax.get_subplotspec().get_gridspec().nrows == 1:
        fig.subplots_adjust(left=0.08, right=0.74, bottom=0.17, top=0.9)   # fixed: no tight_layout
    return fig


def plot_stage_memory(memory: Sequence[StageMemory], layout_text: str, limit: float | None = None,
                      ranks_per_stage: int | None = None, ax=None) -> Figure:
    """The bytes on each rank, one bar per pipeline stage (every rank of a stage holds the same)."""
    step = max(1, len(memory) // 16)          # at most 16 bars, the first and the last stage kept
    shown = sorted(set(range(0, len(memory), step)) | {len(memory) - 1})
    columns = [(str(r), memory[r].terms) for r in shown]
    each = "" if ranks_per_stage is None else f" (each of its {ranks_per_stage} ranks holds the same)"
    return plot_stacked_memory(columns, limit, f"Memory per rank: {layout_text}",
                               f"pipeline stage{each}", ax)


def plot_step_times(rows: Sequence[tuple[str, dict[str, float]]], title: str = "Predicted step time",
                    ax=None) -> Figure:
    """Horizontal stacked bars: for each ``(layout, {cause: seconds})``, where the step goes."""
    fig, ax = figure_axes(ax, (9, 0.45 * len(rows) + 1.6))
    causes = [c for c in TIME_COLORS if any(r[1].get(c, 0) for r in rows)]
    lefts = [0.0] * len(rows)
    for cause in causes:
        widths = [r[1].get(cause, 0.0) for r in rows]
        ax.barh(range(len(rows)), widths, left=lefts, color=TIME_COLORS[cause],
                edgecolor="black", linewidth=0.4, label=cause)
        lefts = [a + w for a, w in zip(lefts, widths)]
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per step (predicted)")
    ax.set_title(title)
    legend_right(ax, fontsize=7, title="time spent on", title_fontsize=8)
    height = fig.get_figheight()
    fig.subplots_adjust(left=0.36, right=0.77, bottom=0.8 / height, top=1 - 0.45 / height)
    return fig


def plot_against_gpu(memory: Sequence[tuple[str, dict[str, float]]],
                     shards: dict[str, tuple[Sequence[int], Sequence[float], Sequence[float]]],
                     ceiling: float, flat: float, peak: float) -> Figure:
    """Left: one layer's activations in units of s·b·h, a group of bars per ``(layer, {series:
    value})``. Right: TFLOP/s of one tensor-parallel rank's share of a layer against t, for each
    ``{model: (t values, measured, predicted)}``, beside a large matmul's ``ceiling``, the ``flat``
    efficiency the old planner assumed and the ``peak`` (all FLOP/s)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw=dict(width_ratios=(1.2, 1)))
    series = list(dict.fromkeys(k for _, values in memory for k in values))
    width = 0.8 / len(series)
    for j, name in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(memory))]
        ys = [values.get(name, 0.0) for _, values in memory]
        bars = left.bar(xs, ys, width=width * 0.95, color=_MUTED[j], edgecolor="black",
                        linewidth=0.4, label=name)
        left.bar_label(bars, fmt="%.0f", fontsize=7)
    left.set_xticks(range(len(memory)))
    left.set_xticklabels([m[0] for m in memory], fontsize=8)
    left.set_ylabel("activations of one layer (s·b·h)")
    left.set_title("Memory: what one layer keeps for backward")
    left.legend(fontsize=7, loc="upper left")
    for i, (name, (ts, measured, predicted)) in enumerate(shards.items()):
        colour = (_MUTED[0], _MUTED[6], _MUTED[3])[i % 3]
        right.plot(ts, [v / 1e12 for v in measured], "o", color=colour, label=f"{name}: measured")
        right.plot(ts, [v / 1e12 for v in predicted], "-", color=colour, label=f"{name}: layer_seconds")
    for value, style, text in ((peak, "-", "peak (datasheet)"), (ceiling, ":", "an 8192³ matmul"),
                               (flat, "--", "one flat 50 % (old planner)")):
        right.axhline(value / 1e12, color="black", linestyle=style, linewidth=1)
        right.text(0.95, value / 1e12, text, fontsize=7, va="bottom", ha="left")
    right.set_xscale("log", base=2)
    right.set_xticks([1, 2, 4, 8])
    right.set_xticklabels(["1", "2", "4", "8"])
    right.set_xlabel("tensor-parallel ranks t (one rank's share of a layer)")
    right.set_ylabel("TFLOP/s")
    right.set_ylim(0, peak / 1e12 * 1.08)
    right.set_title("Time: one rank's share, forward + backward")
    right.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig
