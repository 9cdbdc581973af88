"""Tensor-parallel figures: who holds which part of each tensor, step by step, and how wrong it is.

They draw a check's step trace (``report.steps``, ``checking/trace.py``) and never start ranks.
Each tensor is drawn as its 2-D view (rows = the flattened batch dims, a weight as ``W [in, out]``),
one small panel per rank: a rank's cells in its colour, hatched for a partial sum, one band per rank
for a complete sum (as in notebook 00), grey where it holds nothing; a failing rank is framed red.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.legend_handler import HandlerTuple
from matplotlib.patches import Patch, Rectangle

from mtb_helpers.plots.live import LiveFigure, Png
from mtb_helpers.plots.errors import plot_errors  # noqa: F401  (the shared figure; notebooks import it from here)
from mtb_helpers.plots.palette import EMPTY_COLOR, FAIL_COLOR, bands, rank_color, rank_legend_handles
from mtb_helpers.plots.parts import fail_copy

__all__ = ["plot_step", "plot_steps", "plot_errors", "step_title", "steps_png"]

# a step's placement (trace.Step.layout, DTensor's words) and what it means for the drawn 2-D view
LAYOUT_TEXT = {"Shard(0)": "Shard(0): split by rows", "Shard(-1)": "Shard(-1): split by columns",
               "Replicate()": "Replicate(): every rank holds all of it",
               "Partial()": "Partial(): every rank holds a full-size addend of the sum",
               "Partial('max')": "Partial('max'): every rank holds a candidate, the max is the value"}
MAX_CELL_LINES = 24   # above this many rows/cols, only shard boundaries get grid lines


def _find_step(steps, step):
    if not isinstance(step, (int, str)):
        return step
    for s in steps:
        if (isinstance(step, int) and s.index == step) or s.name == step:
            return s
    raise ValueError(f"no step {step!r}; steps: {', '.join(f'{s.index} {s.name}' for s in steps)}")


def step_title(step) -> str:
    """``'4. forward: local matmul   Y_r = X @ W_r + bias_r'`` plus the collective it runs, if any."""
    text = f"{step.index}. {step.phase}: {step.name}    {step.formula}"
    c = step.collective
    if c and c.get("missing"):
        text += f"\ncollective: {c['region']} ({c['direction']}) NOT ISSUED"
    elif c:
        op = f"{c['op']} ({c['operator']})" if c.get("operator") else c["op"]
        text += (f"\ncollective: {op}, {c['direction']}, {c['bytes']} B in / "
                 f"{c['sent_bytes']} B sent per rank")
    return text


def _draw_holding(ax: Axes, step, holding, rank: int, extent: tuple[int, int]) -> None:
    """Draw rank ``rank``'s part of ``step`` on ``ax`` within axes limits ``extent`` (rows, cols)."""
    rows, cols = step.global_shape
    ax.add_patch(Rectangle((0, 0), cols, rows, facecolor=EMPTY_COLOR, edgecolor="none"))
    if holding.shape is not None:
        for patch in _held_patches(step, holding, rank):
            ax.add_patch(patch)
    ax.add_collection(LineCollection(_grid_segments(rows, cols), colors="white", linewidths=0.6))
    ax.add_patch(Rectangle((0, 0), cols, rows, fill=False, edgecolor="black", linewidth=0.8))
    ax.set_xlim(-0.5, extent[1] + 0.5)
    ax.set_ylim(extent[0] + 0.5, -0.5)          # row 0 on top, like a printed matrix
    ax.set_aspect("equal")
    ax.set_xticks([0, cols])
    ax.set_yticks([0, rows])
    ax.tick_params(labelsize=8, length=2)
    ax.set_title(_holding_title(step, holding, rank), fontsize=9,
                 color="black" if holding.passed else FAIL_COLOR)
    if not holding.passed:
        for side in ax.spines.values():
            side.set_edgecolor(FAIL_COLOR)
            side.set_linewidth(2.5)
    else:
        for side in ax.spines.values():
            side.set_visible(False)


def _held_patches(step, holding, rank: int, x0: float = 0, y0: float = 0, scale: float = 1) -> list:
    """What ``rank`` holds, at (x0, y0), cell size ``scale``: its colour, hatched if a partial sum;
    an issued all-reduce's or reduce-scatter's complete sum: a band per rank in every cell column (00)."""
    (r0, r1), (c0, c1) = holding.rows, holding.cols
    y, height, c = y0 + r0 * scale, (r1 - r0) * scale, step.collective
    if not holding.partial and c and not c.get("missing") and c["op"] in ("all_reduce", "reduce_scatter"):
        colors = [rank_color(k) for k in range(len(step.holdings))]
        return [band for c in range(c0, c1) for band in bands(x0 + c * scale, y, scale, height, colors)]
    return [Rectangle((x0 + c0 * scale, y), (c1 - c0) * scale, height, facecolor=rank_color(rank),
                      edgecolor="white" if holding.partial else "none",
                      hatch="//" if holding.partial else None, linewidth=0)]


def _holding_what(step, holding, rank: int) -> str:
    """``rank 1: rows 4:8``: what a rank holds of ``step``."""
    rows, cols = step.global_shape
    if holding.shape is None:
        return f"rank {rank}:\nnot produced"
    what = "partial sum" if holding.partial else (
        "all" if (holding.rows, holding.cols) == ((0, rows), (0, cols))
        else f"rows {holding.rows[0]}:{holding.rows[1]}" if holding.cols == (0, cols)
        else f"cols {holding.cols[0]}:{holding.cols[1]}")
    return f"rank {rank}:{chr(10) if len(what) > 10 else ' '}{what}"


def _holding_title(step, holding, rank: int) -> str:
    """``rank 1: rows 4:8`` / ``err 0``: what a rank holds of ``step`` and how wrong it is (a partial
    sum: against the term it should hold, ``err 0 vs its term``)."""
    if holding.shape is None:
        return _holding_what(step, holding, rank) + "\nerr missing"
    err = "0" if holding.max_abs_err == 0 else f"{holding.max_abs_err:.1e}"
    # a partial sum is compared with the one term this rank should hold, not with the full sum
    return f"{_holding_what(step, holding, rank)}\nerr {err}" + (" vs its term" if holding.partial else "")


def _grid_segments(rows: int, cols: int, x0: float = 0, y0: float = 0, scale: float = 1) -> list:
    """White cell lines of a rows x cols tensor (outline only past MAX_CELL_LINES) for one
    LineCollection: one artist instead of one line per row and column."""
    ys = range(rows + 1) if rows <= MAX_CELL_LINES else (0, rows)
    xs = range(cols + 1) if cols <= MAX_CELL_LINES else (0, cols)
    return ([[(x0, y0 + y * scale), (x0 + cols * scale, y0 + y * scale)] for y in ys]
            + [[(x0 + x * scale, y0), (x0 + x * scale, y0 + rows * scale)] for x in xs])


def _axis_names(step) -> tuple[str, str]:
    """Axis labels of a step's 2-D view: a weight is ``[in, out]`` (the embedding ``[vocab, h]``),
    an activation ``[tokens, features]``, the loss's per-token numbers ``[s, b]``."""
    name, bare = step.tensor, step.tensor.lstrip("d")
    if bare.startswith("W"):
        ins, outs = ("token ids", "features") if bare == "W_emb" else ("in features", "out features")
        return f"{name} rows ({ins})", f"{name} columns ({outs})"
    if bare.startswith("b"):
        return "", f"{name} (out features)"
    if name in ("mx", "sum_exp", "target_logit", "loss"):   # one number per token of the [s, b] ids
        return f"{name} rows (positions s)", f"{name} columns (sequences b)"
    return f"{name} rows (tokens)", f"{name} columns (features)"


def _legend(fig: Figure, world_size: int) -> None:
    handles = [*rank_legend_handles(world_size),
               Patch(facecolor="white", edgecolor="black", hatch="//"),
               tuple(Patch(facecolor=rank_color(r), edgecolor="none") for r in range(world_size)),
               Patch(facecolor=EMPTY_COLOR, edgecolor="black"),
               Patch(facecolor="white", edgecolor=FAIL_COLOR, linewidth=2)]
    labels = [f"rank {r}" for r in range(world_size)] + [
        "partial sum", "complete sum (a band per rank)", "not held", "wrong / missing"]
    fig.legend(handles=handles, labels=labels, handler_map={tuple: HandlerTuple(ndivide=None, pad=0)},
               loc="lower center", ncol=(world_size + 5) // 2, fontsize=8, frameon=False)   # two rows


def plot_step(report, step, figsize: tuple[float, float] | None = None) -> Figure:
    """One step of ``report.steps`` (its index, name or the Step itself): one panel per rank
    showing which part of the global tensor that rank holds, and its error."""
    s = _find_step(report.steps, step)
    t = len(s.holdings)
    rows, cols = s.global_shape
    width = min(10.0, 1.2 + 2.3 * t)
    panel_h = max(1.2, min(3.0, (width - 1.2) / t * rows / max(cols, 1)))
    fig, axes = plt.subplots(1, t, figsize=figsize or (width, panel_h + 2.2), squeeze=False)
    for r, h in enumerate(s.holdings):
        _draw_holding(axes[0][r], s, h, r, s.global_shape)
        if t > 4:   # eight panels in 10 inches: shorter titles, or they run into each other
            axes[0][r].title.set_fontsize(7)
    axes[0][0].set_xlabel(_axis_names(s)[1], fontsize=8)
    axes[0][0].set_ylabel(_axis_names(s)[0], fontsize=8)
    title = step_title(s) + f"\n{s.tensor} is {rows} x {cols}, {LAYOUT_TEXT[s.layout]}"
    fig.suptitle(title, fontsize=10, x=0.02, ha="left")
    _legend(fig, t)
    top = 1 - (0.19 * (title.count("\n") + 1) + 0.1) / fig.get_figheight()   # inches: 0.19/line
    fig.tight_layout(rect=(0, 0.75 / fig.get_figheight(), 1, top))   # the legend takes two rows
    return fig


def plot_steps(report, phase: str | None = None, steps: list | None = None,
               errors: bool = True) -> Figure:
    """Every step (or those of one ``phase``, or the listed ones) as a grid: one row per step,
    one column per rank, on one Axes. The overview of a check on one figure: above each panel
    what the rank holds and (``errors``) its error, red where it is wrong. ``errors=False`` is
    what an explorer shows, via ``steps_png``: the check table and the error figure beside it
    have the errors."""
    chosen = [_find_step(report.steps, s) for s in steps] if steps else [
        s for s in report.steps if phase in (None, s.phase)]
    return LIVE_STEPS.figure((report, chosen, errors))


def _step_heights(chosen: list) -> list[float]:
    """Inches per row of the overview: more for a tall tensor (fc2's W2 [ffn, h]), not a sliver."""
    return [1.35 if r <= 2 * c else min(4.0, 0.6 + 0.1 * r) for r, c in (s.global_shape for s in chosen)]


def _step_label(s) -> str:
    label = f"{s.index}. {s.name}\n{s.tensor} {s.global_shape[0]}x{s.global_shape[1]}"
    return label + ("" if not s.collective else "\nNOT ISSUED" if s.collective.get("missing")
                    else "\n" + s.collective["op"])


def _panel_text(s, h, r: int, errors: bool) -> str:
    return _holding_title(s, h, r) if errors else _holding_what(s, h, r)


def _steps_key(data) -> tuple:
    """What the overview's static layer depends on: the check, the steps, who holds what (and,
    with the errors, every panel's text)."""
    report, chosen, errors = data
    return (report.check, errors, tuple((_step_label(s), s.global_shape, s.layout, tuple(
        (h.shape is None, h.rows, h.cols, h.partial, _panel_text(s, h, r, errors))
        for r, h in enumerate(s.holdings))) for s in chosen))


def _steps_geometry(chosen: list, t: int) -> dict:
    """Inches on the one Axes: panel (step i, rank r) at origin (x0, y0) with cell size scale."""
    left, top, bottom = 1.75, 0.45, 0.65
    heights = _step_heights(chosen)
    width, height = min(10.0, 3.6 + 1.7 * t), 1.0 + sum(heights)
    cw = (width - left - 0.1) / t
    tops = [top + sum(heights[:i]) * (height - top - bottom) / sum(heights) for i in range(len(chosen))]
    panels = {}
    for i, s in enumerate(chosen):
        (rows, cols), cy = s.global_shape, tops[i]
        ch = heights[i] * (height - top - bottom) / sum(heights)
        scale = min((cw - 0.45) / max(cols, 1), (ch - 0.62) / max(rows, 1))
        for r in range(t):
            panels[i, r] = (left + r * cw + 0.3 + (cw - 0.45 - cols * scale) / 2, cy + 0.48,
                            cols * scale, rows * scale, scale)
    middles = [tops[i] + heights[i] * (height - top - bottom) / sum(heights) / 2 for i in range(len(chosen))]
    return {"size": (width, height), "left": left, "middles": middles, "panels": panels}


def _build_steps(new_figure, data) -> dict:
    """The static layer: every panel's shard layout, what each rank holds (and how wrong it is,
    red when it fails, with ``errors``), the step names."""
    report, chosen, errors = data
    t = len(chosen[0].holdings)
    geo = _steps_geometry(chosen, t)
    width, height = geo["size"]
    fig = new_figure((width, height))
    ax = fig.add_axes((0, 0, 1, 1), xlim=(0, width), ylim=(height, 0))
    ax.set_axis_off()
    lines, labels = [], []
    for i, s in enumerate(chosen):
        labels += [ax.text(geo["left"] - 0.12, geo["middles"][i], _step_label(s),
                ha="right", va="center", fontsize=8)]
        for r, h in enumerate(s.holdings):
            x0, y0, w, hgt, scale = geo["panels"][i, r]
            ax.add_patch(Rectangle((x0, y0), w, hgt, facecolor=EMPTY_COLOR, edgecolor="none"))
            if h.shape is not None:
                for patch in _held_patches(s, h, r, x0, y0, scale):
                    ax.add_patch(patch)
            lines += _grid_segments(*s.global_shape, x0, y0, scale)
            ax.add_patch(Rectangle((x0, y0), w, hgt, fill=False, edgecolor="black", linewidth=0.8))
            ax.text(x0 + w / 2, y0 - 0.08, _panel_text(s, h, r, errors), ha="center", va="bottom",
                    fontsize=7.5, color=FAIL_COLOR if errors and not h.passed else "black")
    ax.add_collection(LineCollection(lines, colors="white", linewidths=0.6))
    fig.suptitle("", fontsize=11, y=1 - 0.1 / height)   # the verdict: set by every update
    _legend(fig, t)
    return {"ax": ax, "geo": geo, "labels": labels}


def _update_steps(fig: Figure, ctx: dict, data) -> list:
    """The values: a red frame on every panel whose rank is wrong, failing step names in red,
    the title with the verdict (the errors themselves are in the check table and error figure)."""
    report, chosen, _ = data
    ax, geo, drawn = ctx["ax"], ctx["geo"], []
    for text, (i, s) in zip(ctx["labels"], enumerate(chosen)):
        text.set_color("black" if s.passed else FAIL_COLOR)
        if not s.passed:   # drawn over the static black label in an explorer
            drawn.append(fail_copy(fig, text))
        for r, h in enumerate(s.holdings):
            if not h.passed:
                x0, y0, w, hgt, _ = geo["panels"][i, r]
                drawn.append(ax.add_patch(Rectangle((x0 - 0.03, y0 - 0.03), w + 0.06, hgt + 0.06,
                                                    fill=False, edgecolor=FAIL_COLOR, linewidth=2.5)))
    t = len(chosen[0].holdings)
    fig.suptitle(f"{report.check}: who holds what, step by step ({t} ranks)"
                 + ("" if report.passed else " - FAILED"))
    return drawn + [fig._suptitle]


LIVE_STEPS = LiveFigure(_steps_key, _build_steps, _update_steps)


def steps_png(report, phase: str | None = None) -> Png:
    """``plot_steps(report, phase, errors=False)`` as PNG for an explorer: the layouts are drawn
    once per shape of the check, the red frames and the verdict on every redraw."""
    return LIVE_STEPS.png((report, [s for s in report.steps if phase in (None, s.phase)], False))
