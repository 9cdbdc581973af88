"""Pipeline figures: the Gantt chart of a simulated schedule, bubble against micro-batch count, and
peak activations per rank and schedule; the Gantt rows and op boxes (``gantt_rows``, ``draw_ops``)
and the peak bars (``plot_stashed``) are notebook 09's measured figures' too.

Colours: stage r runs on rank r, so its row carries rank_color(r) in a band on the left (as in
every figure of the course). Op kinds use their own palette (Paul Tol's "light" scheme, also
colour-blind safe) so they are never mistaken for ranks; idle time is grey and hatched.
"""
from __future__ import annotations

import functools
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.collections import PathCollection, PolyCollection
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.path import Path
from matplotlib.textpath import TextPath
from matplotlib.transforms import Affine2D

from mtb_helpers.plots.palette import EMPTY_COLOR, rank_color, rank_legend_handles
from mtb_helpers.plots.parts import figure_axes, label_size, legend_right, stacked_bar
from mtb_helpers.pp.schedules import SCHEDULES, closed_form, schedule, simulate
from mtb_helpers.pp.simulator import Timeline

__all__ = ["OP_COLORS", "gantt_rows", "draw_ops", "plot_gantt", "plot_bubble_vs_microbatches",
           "plot_peak_memory", "plot_stashed", "plot_stage_layout"]

OP_COLORS = {"F": "#77AADD", "B": "#EE8866", "I": "#EEDD88", "W": "#44BB99"}
OP_NAMES = {"F": "F forward", "B": "B backward (input and weight grads)", "I": "I input grad",
            "W": "W weight grad (dW)"}
IDLE_HATCH = "///"


def _shade(color: str, chunk: int, chunks: int) -> tuple[float, float, float]:
    """Later model chunks get paler versions of the op colour (Megatron's figures do the same).
    The last chunk is mixed 75 % towards white, so two chunks are easy to tell apart, while
    black labels stay readable on every shade."""
    mix = 0.75 * chunk / max(chunks - 1, 1)
    return tuple(c + (1 - c) * mix for c in to_rgb(color))


def _description(timeline: Timeline, name: str | None) -> str:
    p = timeline.ranks
    m = len({e.op.microbatch for e in timeline.events[0]})
    v = f", v={timeline.chunks} chunks" if timeline.chunks > 1 else ""
    return f"{name + ': ' if name else ''}p={p} stages, m={m} micro-batches{v}"


def _gantt_handles(timeline: Timeline) -> list[Patch]:
    chunks = timeline.chunks
    kinds = sorted({e.op.kind for evs in timeline.events for e in evs}, key="FBIW".index)
    handles = [Patch(facecolor=_shade(OP_COLORS[k], c, chunks), edgecolor="black",
                     label=OP_NAMES[k] + (f", chunk {c}" if chunks > 1 else ""))
               for k in kinds for c in range(chunks)]
    handles.append(Patch(facecolor=EMPTY_COLOR, edgecolor="#999999", hatch=IDLE_HATCH,
                         label="idle (bubble)"))
    handles.append(Patch(facecolor=rank_color(0), label="left band: the stage's rank colour"))
    return handles


def gantt_rows(ax: plt.Axes, p: int, chunks: int, band: float) -> None:
    """A Gantt chart's rows: rank r's colour in a band ``band`` wide left of time 0, stage 0 on
    top; interleaved rows name ranks (rank r holds virtual stages r, p + r, ...), not stages."""
    for r in range(p):
        ax.add_patch(Rectangle((-band * 1.6, p - 1 - r - 0.4), band, 0.8, color=rank_color(r)))
    row = "rank" if chunks > 1 else "stage"
    ax.set_yticks(range(p), [f"{row} {r}" for r in reversed(range(p))])
    ax.set_ylim(-0.6, p - 0.4)
    ax.set_ylabel("rank (chunk c = virtual stage c·p + r)" if chunks > 1 else "stage (= rank)")


@functools.lru_cache(maxsize=512)
def _label_path(text: str, size: float) -> Path:
    """``text`` (lines centred on each other) as glyph outlines ``size`` points high, centred on
    (0, 0), in points: a box's micro-batch number drawn as part of one collection."""
    parts, y = [], 0.0
    for line in text.split("\n"):
        glyphs = TextPath((0, 0), line, size=size)
        (x0, _), (x1, _) = glyphs.get_extents().get_points()
        parts.append(glyphs.transformed(Affine2D().translate(-(x0 + x1) / 2, y)))
        y -= size   # linespacing 1.0
    path = Path.make_compound_path(*parts)
    (_, y0), (_, y1) = path.get_extents().get_points()
    return path.transformed(Affine2D().translate(0, -(y0 + y1) / 2))


def boxes(spans: list[tuple[float, float, float]]) -> np.ndarray:
    """``[n, 4, 2]`` rectangle corners of boxes ``(start, end, y)``, 0.8 high, for PolyCollection."""
    a = np.asarray(spans, dtype=float).reshape(-1, 3)
    x0, x1, y = a[:, 0], a[:, 1], a[:, 2]
    return np.stack([np.stack([x0, y - 0.4], 1), np.stack([x0, y + 0.4], 1),
                     np.stack([x1, y + 0.4], 1), np.stack([x1, y - 0.4], 1)], 1)


def draw_ops(fig: Figure, ax: plt.Axes, timeline: Timeline) -> list:
    """One box per op of ``timeline`` in its kind's colour (paler for later chunks), labelled
    with its micro-batch (interleaved: and its chunk, shades alone are hard to tell apart) where
    the label fits; set the x limits first. Boxes and labels are one collection each: ~150
    artists drawn one by one cost more than an explorer's whole run on the ranks."""
    p, chunks = timeline.ranks, timeline.chunks
    lo, hi = ax.get_xlim()
    axes_points = fig.get_figwidth() * ax.get_position().width * 72
    spans, faces, labels, centres = [], [], [], []
    for r in range(p):
        for e in timeline.events[r]:
            spans.append((e.start, e.end, p - 1 - r))
            faces.append(_shade(OP_COLORS[e.op.kind], e.op.chunk, chunks))
            text = str(e.op.microbatch) + (f"\nc{e.op.chunk}" if chunks > 1 else "")
            size = label_size((e.end - e.start) / (hi - lo) * axes_points, text,
                              9.0 if chunks == 1 else 7.5)
            if size:
                labels.append(_label_path(text, round(size * 4) / 4))
                centres.append(((e.start + e.end) / 2, p - 1 - r))
    drawn = [ax.add_collection(PolyCollection(boxes(spans), facecolor=faces, edgecolor="black",
                                              linewidth=0.6), autolim=False)]
    if labels:
        drawn.append(ax.add_collection(PathCollection(
            labels, offsets=centres, offset_transform=ax.transData, facecolor="black",
            edgecolor="none", linewidth=0.0, zorder=3,
            transform=Affine2D().scale(fig.dpi / 72)), autolim=False))
    return drawn


def plot_gantt(timeline: Timeline, name: str | None = None, ax: plt.Axes | None = None,
               width: float = 10.0) -> Figure:
    """One row per stage (stage 0 on top), one box per op labelled with its micro-batch.

    ``timeline`` comes from ``simulate``; ``name`` (e.g. "1f1b") goes into the title next to the
    bubble fraction. Draws into ``ax`` when given, else into a new figure ``width`` inches wide.
    """
    p, chunks, span = timeline.ranks, timeline.chunks, timeline.makespan
    own_figure = ax is None
    fig, ax = figure_axes(ax, (width, 2.0 + 0.5 * p))
    band = span * 0.025  # the rank-colour band left of time 0
    gantt_rows(ax, p, chunks, band)
    for r in range(p):
        for lo, hi in timeline.idle_intervals(r):
            ax.add_patch(Rectangle((lo, p - 1 - r - 0.4), hi - lo, 0.8, facecolor=EMPTY_COLOR,
                                   edgecolor="#999999", hatch=IDLE_HATCH, linewidth=0.0))
    ax.set_xlim(-band * 2, span * 1.01)
    draw_ops(fig, ax, timeline)
    forward = next((e.end - e.start) * chunks for e in timeline.events[0] if e.op.kind == "F")
    ax.set_xlabel("time (units of one forward F)" if abs(forward - 1.0) < 1e-12
                  else f"time (one forward F = {forward:g})")
    ax.set_title(f"{_description(timeline, name)}\nmakespan {span:g}, bubble "
                 f"{timeline.bubble_fraction:.1%} of p x makespan (hatched = idle)")
    handles = _gantt_handles(timeline)
    legend_title = "numbers in boxes = micro-batch" + (" (c = chunk)" if chunks > 1 else "")
    if own_figure:  # legend right under the x label, in room reserved at the bottom
        ncol = len(handles) if len(handles) <= 5 else -(-len(handles) // 2)
        bottom = (0.3 + 0.2 * -(-len(handles) // ncol)) / fig.get_figheight()
        fig.tight_layout(rect=(0, bottom, 1, 1))
        fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, bottom), ncol=ncol,
                   fontsize=8, frameon=False, title=legend_title, title_fontsize=8)
    else:
        legend_right(ax, handles, title="numbers = micro-batch", title_fontsize=8)
    return fig


def plot_bubble_vs_microbatches(stage_counts: Sequence[int] = (2, 4, 8), max_microbatches: int = 32,
                                name: str = "1f1b", chunks: int | None = None,
                                forward: float = 1.0, backward: float = 2.0) -> Figure:
    """Simulated bubble fraction (dots) over m = 1..max against the formula (lines).

    One colour per stage count (a sequential colormap: these are pipeline depths, not ranks).
    For interleaved only multiples of p are possible micro-batch counts.
    """
    fig, ax = plt.subplots(figsize=(8, 4.5))
    cmap = plt.get_cmap("viridis")
    v = chunks or (2 if name == "interleaved" else 1)   # the chunks schedule() takes by default
    for n, p in enumerate(stage_counts):
        color = cmap(n / max(len(stage_counts) - 1, 1) * 0.85)
        ms = [m for m in range(1, max_microbatches + 1) if name != "interleaved" or m % p == 0]
        sim = [simulate(schedule(name, p, m, chunks), forward, backward).bubble_fraction
               for m in ms]
        ref = [closed_form(name, p, m, v, forward, backward)["bubble_fraction"] for m in ms]
        ax.plot(ms, ref, color=color, linewidth=1.5, label=f"p={p} formula")
        ax.plot(ms, sim, "o", color=color, markersize=4, label=f"p={p} simulated")
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("bubble fraction = idle / (p x makespan)")
    ax.set_ylim(0, 1)
    ax.set_title(f"{name}: simulated bubble (dots) against the formula (lines)\n"
                 f"backward = {backward / forward:g} x forward")
    ax.grid(alpha=0.3)
    ax.legend(ncol=2, fontsize=8)
    fig.tight_layout()
    return fig


def plot_peak_memory(stages: int = 4, microbatches: int = 8, chunks: int = 2,
                     names: Sequence[str] = tuple(SCHEDULES)) -> Figure:
    """Peak stashed activations per stage for each schedule, in whole-stage micro-batch units
    (``plot_stashed``'s bars, rank colours); interleaved chunk activations count 1/chunks each (a
    chunk holds 1/v of the stage's layers). A schedule these sizes do not fit (interleaved with m
    not a multiple of p) is left out."""
    peaks = {}
    for name in names:
        try:
            ops = schedule(name, stages, microbatches, chunks if name == "interleaved" else None)
        except ValueError:
            continue
        peaks[name] = simulate(ops).peak_memory
    return plot_stashed(peaks, {}, "peak activations held\n(micro-batches of one whole stage)",
                        f"Peak activation memory per rank: p={stages}, m={microbatches}, "
                        f"interleaved v={chunks}", line=(stages, f"p = {stages}"))


def plot_stashed(series: dict[str, Sequence[float]], simulated: dict[str, Sequence[int]],
                 ylabel: str = "peak micro-batch activations stashed",
                 title: str = "Activations held at the peak, measured on the ranks",
                 line: tuple[float, str] | None = None) -> Figure:
    """Bars: what each rank held at its peak, per schedule (rank colours); a black tick marks
    the simulator's ``peak_activations`` for the same rank; ``line`` = (height, label) draws a
    dotted reference line."""
    names = list(series)
    p = len(next(iter(series.values())))
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / p
    for n, name in enumerate(names):
        for r, value in enumerate(series[name]):
            x = n + (r - (p - 1) / 2) * width
            stacked_bar(ax, x, [(value, {"color": rank_color(r)})], width * 0.9,
                        simulated[name][r] if name in simulated else None, edgecolor="black")
    ax.set_xticks(range(len(names)), names)
    ax.set_xlabel("schedule (one bar per rank)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    handles = rank_legend_handles(p)
    if simulated:
        handles.append(Line2D([], [], color="black", linewidth=2.5, label="simulator's peak"))
    if line:
        ax.axhline(line[0], color="black", linestyle=":", linewidth=1)
        handles.append(Line2D([], [], color="black", linestyle=":", label=line[1]))
    ax.legend(handles=handles, fontsize=8, ncol=min(len(handles), 5), loc="upper left")
    ax.set_ylim(0, max(max(v) for v in series.values()) * 1.35 + 0.5)
    fig.tight_layout()
    return fig


def plot_stage_layout(stages: int = 4, microbatches: int = 4) -> Figure:
    """Who holds what: stage r (rank r) holds its own layers; micro-batches X_i enter stage 0,
    activations [s, b, h] go right by send/recv, their gradients come back left; loss on the last."""
    fig, ax = plt.subplots(figsize=(9, 2.6))
    for r in range(stages):
        x = 1.0 + 2.0 * r
        ax.add_patch(Rectangle((x, 0.0), 1.3, 1.0, facecolor=rank_color(r), alpha=0.35,
                               edgecolor=rank_color(r), linewidth=2.5))
        ax.text(x + 0.65, 0.5, f"stage {r}\nrank {r}\nits layers", ha="center", va="center",
                fontsize=9)
        if r < stages - 1:  # forward activation right (top), its gradient left (bottom)
            ax.annotate("", xy=(x + 2.0, 0.75), xytext=(x + 1.3, 0.75),
                        arrowprops=dict(arrowstyle="->", color="black"))
            ax.annotate("", xy=(x + 1.3, 0.25), xytext=(x + 2.0, 0.25),
                        arrowprops=dict(arrowstyle="->", color="#D55E00"))
    ax.text(0.15, 0.5, "\n".join(f"X{i}" for i in range(min(microbatches, 4)))
            + ("\n..." if microbatches > 4 else ""), ha="center", va="center", fontsize=8)
    ax.annotate("", xy=(1.0, 0.5), xytext=(0.4, 0.5), arrowprops=dict(arrowstyle="->"))
    end = 1.0 + 2.0 * (stages - 1) + 1.3
    ax.annotate("", xy=(end + 0.6, 0.5), xytext=(end, 0.5), arrowprops=dict(arrowstyle="->"))
    ax.text(end + 0.7, 0.5, "loss", va="center", fontsize=9)
    handles = [Line2D([], [], color="black",
                      label="F: stage r sends its output Y_r [s, b, h] to stage r+1"),
               Line2D([], [], color="#D55E00",
                      label="B: stage r sends the gradient dY_{r-1} [s, b, h] back to stage r-1")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=2,
              fontsize=8, frameon=False)
    ax.set_xlim(-0.2, end + 1.5)
    ax.set_ylim(-0.1, 1.1)
    ax.set_axis_off()
    ax.set_title(f"Pipeline parallelism: the layers split into {stages} stages, "
                 f"{microbatches} micro-batches X_i flow through")
    fig.tight_layout()
    return fig
