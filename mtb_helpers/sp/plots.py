"""Sequence-parallel figures: which sequence rows each rank holds at each step, and what SP saves.

``plot_sequence_layout`` draws a check's step trace (``report.steps``) as one column per step and,
inside it, one strip per rank, with the sequence running down: a cell is in the rank's colour when
the rank holds that sequence position. A strip only part as wide as the others holds only some
feature columns of every position (fc1 and GeLU hold ``ffn/t`` columns); hatching marks a partial
sum; grey is "not held"; a red frame marks a wrong or missing result. Errors per step reuse
``plots.errors.plot_errors`` (shared). ``plot_activation_memory`` and ``plot_communication`` draw the figures of
``sp.memory.measure_activation_memory``. They never start ranks.
"""
from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.collections import LineCollection
from matplotlib.patches import Patch, Rectangle

from mtb_helpers.plots.live import LiveFigure, Png
from mtb_helpers.plots.palette import EMPTY_COLOR, FAIL_COLOR, rank_color, rank_legend_handles
from mtb_helpers.plots.errors import plot_errors  # noqa: F401  (re-exported: notebook 04 draws it from here)
from mtb_helpers.plots.parts import fail_copy, figure_axes, legend_right, stacked_bar
from mtb_helpers.sp.layers import keep_mask
from mtb_helpers.sp.memory import VARIANT_LABELS

__all__ = ["plot_sequence_layout", "sequence_layout_png", "plot_errors", "plot_dropout_masks", "plot_activation_memory",
           "plot_communication", "TERM_COLORS"]

COLLECTIVE_TEXT = {"all_gather": "all-gather", "reduce_scatter": "reduce-scatter",
                   "all_reduce": "all-reduce", "split": "split"}
# Terms of the activation model; greys and a light hue, so they never look like a rank colour.
TERM_COLORS = {"LayerNorm input": "#4D4D4D", "fc1 input": "#878787", "GeLU input": "#BABABA",
               "fc2 input": "#E0E0E0", "dropout mask": "#F4E3C1", "LayerNorm stats": "#FFFFFF"}


def _activation_steps(steps, tokens: int) -> list:
    """The steps whose tensor is a ``[s, b, features]`` activation: ``tokens = s * b`` rows and
    not a weight (whose name starts with W or dW)."""
    return [s for s in steps if s.global_shape[0] == tokens and not s.tensor.lstrip("d").startswith("W")]


def _draw_column(ax: Axes, x0: float, step, batch: int, seq_len: int) -> list:
    """Draw one step's strips (static); return the frames of the strips, for the red marks."""
    t = len(step.holdings)
    width, frames = 0.8 / t, []
    for r, h in enumerate(step.holdings):
        left = x0 + 0.1 + r * width
        ax.add_patch(Rectangle((left, 0), width * 0.9, seq_len, facecolor=EMPTY_COLOR,
                               edgecolor="none"))
        if h.shape is not None:
            (r0, r1), (c0, c1) = h.rows, h.cols
            frac = (c1 - c0) / step.global_shape[1]     # share of the feature columns held
            ax.add_patch(Rectangle((left, r0 / batch), width * 0.9 * frac, (r1 - r0) / batch,
                                   facecolor=rank_color(r), hatch="///" if h.partial else None,
                                   edgecolor="white" if h.partial else "none", linewidth=0))
        else:
            ax.text(left + width * 0.45, seq_len / 2, "missing", rotation=90, ha="center",
                    va="center", fontsize=7, color=FAIL_COLOR)
        frames.append((left, width * 0.9))
    ax.add_collection(LineCollection([[(x0 + 0.1, y), (x0 + 0.9, y)] for y in range(seq_len + 1)],
                                     colors="white", linewidths=0.5))  # one per sequence position
    return frames


def _label(step) -> str:
    name = textwrap.fill(f"{step.index}. {step.name}", 13)
    c = step.collective
    if c and c.get("missing"):
        return f"{name}\nNOT ISSUED"
    return name


def _layout_data(report, phase: str, width: float) -> tuple:
    seq_len, batch = report.config["seq_len"], report.config["batch"]
    steps = [s for s in _activation_steps(report.steps, seq_len * batch) if s.phase == phase]
    if not steps:
        raise ValueError(f"no {phase!r} activation steps in this report")
    return report, phase, width, steps


def _layout_key(data) -> tuple:
    report, phase, width, steps = data
    return (phase, width, report.config["seq_len"], report.config["batch"], tuple(
        (_label(s), s.global_shape, (s.collective or {}).get("op"), tuple(
            (h.shape is None, h.rows, h.cols, h.partial) for h in s.holdings)) for s in steps))


def _build_layout(new_figure, data) -> dict:
    """The static layer: every step's strips, the collectives, the axes and the legend."""
    report, phase, width, steps = data
    seq_len, batch = report.config["seq_len"], report.config["batch"]
    t, n = len(steps[0].holdings), len(steps)
    fig = new_figure((width, 2.9 + 0.16 * seq_len))
    height = fig.get_figheight()
    # the margins tight_layout found for this figure, fixed: no layout pass per redraw
    ax = fig.add_axes((0.6 / width, 1.25 / height, 1 - 0.75 / width, 1 - 1.7 / height))
    frames = [_draw_column(ax, i, s, batch, seq_len) for i, s in enumerate(steps)]
    for i, s in enumerate(steps):
        c = s.collective
        if c and not c.get("missing"):
            ax.annotate(COLLECTIVE_TEXT.get(c["op"], c["op"]), (i + 0.5, -0.4), ha="center",
                        va="bottom", fontsize=8.5, fontweight="bold", annotation_clip=False,
                        bbox=dict(boxstyle="round,pad=0.2", facecolor="#FFF3C4", edgecolor="black",
                                  linewidth=0.6))
    ax.set_xlim(0, n)
    ax.set_ylim(seq_len, -1.6)
    ax.set_xticks([i + 0.5 for i in range(n)], [_label(s) for s in steps], fontsize=7.5)
    ax.set_yticks(range(seq_len), [str(p) for p in range(seq_len)], fontsize=7, va="top")
    ax.set_ylabel("sequence position")
    ax.spines[["top", "right", "bottom"]].set_visible(False)
    ax.tick_params(axis="x", length=0)
    handles = [*rank_legend_handles(t),
               Patch(facecolor="white", edgecolor="black", label="narrow: only ffn/t columns"),
               Patch(facecolor="white", edgecolor="black", hatch="///", label="partial sum"),
               Patch(facecolor=EMPTY_COLOR, edgecolor="black", label="not held"),
               Patch(facecolor="white", edgecolor=FAIL_COLOR, linewidth=2, label="wrong / missing")]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), fontsize=8,
               frameon=False)
    return {"ax": ax, "frames": frames}


def _update_layout(fig: Figure, ctx: dict, data) -> list:
    """The values: red frames on wrong strips, failing step names in red, the verdict."""
    report, phase, _, steps = data
    ax, drawn = ctx["ax"], []
    seq_len, batch = report.config["seq_len"], report.config["batch"]
    for tick, s, frames in zip(ax.get_xticklabels(), steps, ctx["frames"]):
        tick.set_color("black" if s.passed else FAIL_COLOR)
        if not s.passed:   # drawn over the static black label in an explorer
            drawn.append(fail_copy(fig, tick))
        drawn += [ax.add_patch(Rectangle((left, 0), w, seq_len, fill=False, edgecolor=FAIL_COLOR,
                                         linewidth=2.2))
                  for (left, w), h in zip(frames, s.holdings) if not h.passed]
    verdict = "" if report.passed else " - FAILED"
    bug = report.config.get("bug")
    ax.set_title(f"Who holds which sequence rows, {phase} ({len(steps[0].holdings)} ranks, "
                 f"s={seq_len}, b={batch}{', bug ' + bug if bug else ''}){verdict}", fontsize=11)
    return drawn + [ax.title]


LIVE_LAYOUT = LiveFigure(_layout_key, _build_layout, _update_layout)


def plot_sequence_layout(report, phase: str = "forward", width: float = 10.0) -> Figure:
    """One column per activation step of ``phase`` ("forward" or "backward"), one strip per rank,
    sequence positions down the strip. Collective steps are named above their column."""
    return LIVE_LAYOUT.figure(_layout_data(report, phase, width))


def sequence_layout_png(report, phase: str = "forward", width: float = 10.0) -> Png:
    """``plot_sequence_layout`` for an explorer: the strips drawn once per shape, the red marks
    and the verdict on every redraw."""
    return LIVE_LAYOUT.png(_layout_data(report, phase, width))


def plot_dropout_masks(seq_len: int = 8, batch: int = 2, hidden: int = 4, dropout_p: float = 0.3,
                       seed: int = 0, world_size: int = 2) -> Figure:
    """The dropout mask of ``[s, b, h]`` as rank ``r`` sees it (rows = sequence positions, columns
    = the ``b * h`` elements of a position): keyed by global position (one mask, cut into shards)
    next to keyed by local position (the bug: every shard repeats the first shard's mask). Kept
    elements are in the colour of the rank holding that row, dropped ones white."""
    n = seq_len // world_size
    masks = {"keyed by global position (correct):\none mask, each rank holds its rows":
             keep_mask((seq_len, batch, hidden), dropout_p, seed),
             "keyed by local position (bug):\nevery shard repeats rank 0's mask":
             torch.cat([keep_mask((n, batch, hidden), dropout_p, seed) for _ in range(world_size)])}
    fig, axes = plt.subplots(1, 2, figsize=(10, 1.6 + 0.32 * seq_len))
    for ax, (title, mask) in zip(axes, masks.items()):
        flat = mask.reshape(seq_len, -1)
        for i in range(seq_len):
            for j in range(flat.shape[1]):
                color = rank_color(i // n) if flat[i, j] else "white"
                ax.add_patch(Rectangle((j, i), 1, 1, facecolor=color, edgecolor="#BBBBBB",
                                       linewidth=0.5))
        for r in range(1, world_size):   # shard boundaries
            ax.axhline(r * n, color="black", linewidth=1.5)
        ax.set_xlim(0, flat.shape[1])
        ax.set_ylim(seq_len, 0)
        ax.set_yticks([i + 0.5 for i in range(seq_len)], [str(i) for i in range(seq_len)], fontsize=7)
        ax.set_xticks([])
        ax.set_xlabel(f"the b x h = {batch} x {hidden} elements of each position")
        ax.set_ylabel("sequence position")
        ax.set_title(title, fontsize=10)
    fig.suptitle(f"Dropout mask, dropout_p = {dropout_p}, seed {seed}, {world_size} ranks", fontsize=11)
    fig.legend(handles=[*rank_legend_handles(world_size),
                        Patch(facecolor="white", edgecolor="#BBBBBB", label="dropped")],
               loc="lower center", ncol=world_size + 1, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def _bars(figures: list[dict]):
    """(x position, world size, variant key, variant dict) of every bar, grouped by world size."""
    out = []
    for g, fig in enumerate(figures):
        keys = list(fig["variants"])
        for j, key in enumerate(keys):
            out.append((g + (j - (len(keys) - 1) / 2) * 0.27, fig["world_size"], key,
                        fig["variants"][key]))
    return out


def plot_activation_memory(figures: list[dict], ax: Axes | None = None) -> Figure:
    """Bytes each rank saves for backward, measured (stacked by term) for TP only (TP), TP + SP
    (SP) and TP + SP with fc1's input re-gathered (SP+), at each world size; the model's total
    as a black bar."""
    fig, ax = figure_axes(ax, (10, 4.6))
    terms = figures[0]["terms"]
    for x, t, key, v in _bars(figures):
        bottom = stacked_bar(ax, x, [(v["measured"][term], {"color": TERM_COLORS[term]}) for term in terms],
                             0.25, v["model_total"], edgecolor="black", linewidth=0.5)
        ax.text(x, bottom, f"{VARIANT_LABELS[key]}\n{bottom}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(figures)), [f"t = {f['world_size']}" for f in figures])
    ax.set_xlabel("world size (tensor- and sequence-parallel ranks)")
    ax.set_ylabel("bytes saved for backward, per rank")
    f0 = figures[0]
    ax.set_title(f"Activation memory of the block, measured vs Korthikanti et al. 2022 "
                 f"(s={f0['seq_len']}, b={f0['batch']}, h={f0['hidden']}, ffn={f0['ffn_hidden']}, "
                 f"{f0['dtype']})", fontsize=10)
    handles = [Patch(facecolor=TERM_COLORS[k], edgecolor="black", label=k) for k in reversed(terms)]
    handles.append(Line2D([], [], color="black", linewidth=2.5, label="model total\n(no LN stats)"))
    handles += [Line2D([], [], linestyle="", label=text) for text in
                ("TP: tensor parallel only", "SP: TP + sequence parallel",
                 "SP+: SP, fc1 input\nre-gathered in backward",
                 "number on a bar: measured\ntotal with LN stats (the\ntable's total leaves\nthem out)")]
    legend_right(ax, handles)
    ax.set_ylim(0, max(sum(v["measured"].values()) for *_, v in _bars(figures)) * 1.2)
    fig.tight_layout()
    return fig


def plot_communication(figures: list[dict], ax: Axes | None = None) -> Figure:
    """Bytes each rank sends in one forward + backward: the activation collectives (TP's two
    all-reduces vs SP's all-gathers and reduce-scatters) and, hatched on top, SP's all-reduces of
    LayerNorm / bias grads."""
    fig, ax = figure_axes(ax, (10, 4.2))
    colors = {"tp": "#999999", "sp": "#666666", "sp_regather": "#333333"}
    for x, t, key, v in _bars(figures):
        comm = v["communication"]
        stacked_bar(ax, x, [(comm["activation_sent"], {"color": colors[key]}),
                            (comm["param_grad_sent"], {"color": "white", "hatch": "///"})],
                    0.25, edgecolor="black", linewidth=0.5)
        label = f"{comm['activation_sent']}" + (f"\n+{comm['param_grad_sent']}"
                                                 if comm["param_grad_sent"] else "")
        ax.text(x, comm["activation_sent"] + comm["param_grad_sent"], label, ha="center",
                va="bottom", fontsize=7.5)
    ax.set_xticks(range(len(figures)), [f"t = {f['world_size']}" for f in figures])
    ax.set_xlabel("world size")
    ax.set_ylabel("bytes sent per rank (ring)")
    ax.set_title("Bytes on the wire per forward + backward: TP's all-reduces vs SP's "
                 "all-gathers + reduce-scatters", fontsize=10)
    handles = [Patch(facecolor=colors["tp"], edgecolor="black", label="TP only: 2 all-reduces"),
               Patch(facecolor=colors["sp"], edgecolor="black", label="TP + SP: 2 all-gathers + 2 reduce-scatters"),
               Patch(facecolor=colors["sp_regather"], edgecolor="black",
                     label="SP+: one more all-gather (re-gather)"),
               Patch(facecolor="white", edgecolor="black", hatch="///",
                     label="SP: LayerNorm / bias grad all-reduces")]
    legend_right(ax, handles)
    top = max(v["communication"]["activation_sent"] + v["communication"]["param_grad_sent"]
              for *_, v in _bars(figures))
    ax.set_ylim(0, max(top, 1) * 1.2)
    fig.tight_layout()
    return fig
