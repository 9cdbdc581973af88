"""Figures of notebook 14: a step's compute and communication lanes per rank, predicted and
measured step times side by side, the bucket-size curve, and the error mixed precision leaves per
parameter. Plain data in (events as ``(kind, name, start, end, bytes)`` tuples, numbers); rank r
keeps ``rank_color(r)`` as everywhere else; figures of emulated links say so in their title.
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from mtb_helpers.plots.palette import rank_color
from mtb_helpers.plots.parts import figure_axes, legend_right
from mtb_helpers.plots.timelines import draw_lanes

__all__ = ["plot_lanes", "plot_step_times", "plot_bucket_curve", "plot_precision_errors"]

PREDICTED = "#555555"


# one hatch per collective, so that a lane shows which one queues behind which
COLLECTIVES = (("all-reduce", "xxx"), ("all-gather", "////"), ("reduce-scatter", "\\\\\\\\"),
               ("broadcast", "..."))


def _collective(name: str) -> str:
    """The collective an event name stands for: the model's "all-gather 3 fwd" and the ranks'
    "all_gather_single" alike; "other" for anything else (a barrier, a send)."""
    key = name.replace("_", "-")
    for collective, _ in COLLECTIVES:
        if collective in key:
            return collective
    return "other"


def _short(kind: str, name: str) -> str:
    """A box's label: "F3"/"B3" for a layer's forward/backward, "opt", or "AR"/"AG"/"RS"/"BC"."""
    if kind == "comm":
        return {"all-reduce": "AR", "all-gather": "AG", "reduce-scatter": "RS",
                "broadcast": "BC"}.get(_collective(name), "")
    digits = "".join(ch for ch in name if ch.isdigit())
    if "bwd" in name or "backward" in name:
        return f"B{digits}"
    if "fwd" in name or "forward" in name:
        return f"F{digits}"
    return "opt" if "optim" in name else ""


def plot_lanes(events: Sequence[Sequence[tuple]], title: str, predicted: Sequence[tuple] | None = None,
               ax=None, unit: float = 1e-3) -> Figure:
    """Two lanes per rank (compute above, communication below) from each rank's events, times in
    seconds drawn in ms; ``predicted`` (one rank's model events) as the top pair, grey. Each
    collective has its own hatch (all-reduce, all-gather, reduce-scatter), and a box is labelled
    ("F3", "B3", "opt", "AR", "AG", "RS") where the label fits (``plots.timelines.draw_lanes``)."""
    rows = ([("predicted", PREDICTED, predicted)] if predicted is not None else []) + \
        [(f"rank {r}", rank_color(r), evs) for r, evs in enumerate(events)]
    fig, ax = figure_axes(ax, (10, 1.6 + 0.75 * len(rows)))
    hatches = dict(COLLECTIVES)
    seen = {_collective(e[1]) for _, _, evs in rows for e in evs if e[0] == "comm"}
    span = max((e[3] / unit for _, _, evs in rows for e in evs), default=1.0) or 1.0
    draw_lanes(ax, [(name, color, [(e[0], e[2] / unit, e[3] / unit, _short(e[0], e[1]),
                                    hatches.get(_collective(e[1]), "--")) for e in evs])
                    for name, color, evs in rows], span, most=7.0)
    ax.set_xlabel("time in the step (ms of the modelled link)")
    ax.set_title(title, fontsize=10)
    legend = [Patch(facecolor="#BBBBBB", edgecolor="black", label="compute (padded):\nF forward, "
                    "B backward,\nopt optimizer")]
    legend += [Patch(facecolor="white", edgecolor="black", hatch=hatch, label=f"{collective} "
                     f"({_short('comm', collective)})")
               for collective, hatch in COLLECTIVES if collective in seen]
    legend_right(ax, legend, x=1.0)
    fig.tight_layout()
    return fig


def plot_step_times(names: Sequence[str], predicted: Sequence[float], measured: Sequence[float],
                    title: str, unit: float = 1e-3) -> Figure:
    """Predicted (grey, written first) and measured (blue) step time per configuration, the gap
    in percent above each pair."""
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(names)), 3.6))
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [p / unit for p in predicted], 0.4, color=PREDICTED,
           label="predicted (α-β model)")
    ax.bar([x + 0.2 for x in xs], [m / unit for m in measured], 0.4, color=rank_color(0),
           label="measured on the ranks")
    for x, p, m in zip(xs, predicted, measured):
        ax.annotate(f"{(m - p) / p:+.0%}", (x, max(p, m) / unit), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), names, fontsize=8)
    ax.set_ylabel("step time (ms)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.margins(y=0.25)
    fig.tight_layout()
    return fig


def plot_bucket_curve(caps: Sequence[float], predicted: Sequence[float], measured: Sequence[float] | None,
                      no_overlap: float, title: str, buckets: Sequence[int] | None = None,
                      unit: float = 1e-3) -> Figure:
    """Step time against ``bucket_cap_mb``, each cap at its own value on a linear axis (one tick per
    cap, with its number of buckets): the prediction, the measurement, the step without overlap as a
    line, the predicted minimum starred."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    xs = [float(c) for c in caps]
    ax.plot(xs, [p / unit for p in predicted], "o--", color=PREDICTED, label="predicted")
    if measured is not None:
        ax.plot(xs, [m / unit for m in measured], "s-", color=rank_color(0), label="measured")
    ax.axhline(no_overlap / unit, color="black", linestyle=":", label="no overlap (predicted)")
    best = min(range(len(xs)), key=lambda i: predicted[i])
    ax.plot([xs[best]], [predicted[best] / unit], "*", color="black", markersize=14,
            label="predicted minimum")
    ax.set_xticks(xs, [f"{c:g}" + (f"\n{n} bucket{'s' if n > 1 else ''}" if buckets else "")
                       for c, n in zip(caps, buckets or caps)], fontsize=8)
    ax.set_xlabel("bucket_cap_mb (MiB, to scale)")
    ax.set_ylabel("step time (ms)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_precision_errors(names: Sequence[str], errors: dict[str, Sequence[float]], title: str) -> Figure:
    """Max |param - fp32 run's param| per parameter, one bar group per compute dtype (log axis)."""
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(names)), 3.6))
    width = 0.8 / max(1, len(errors))
    shades = ("#333333", "#999999", "#CCCCCC")       # not rank colours: these are dtypes
    for i, (dtype, errs) in enumerate(errors.items()):
        ax.bar([x + (i - (len(errors) - 1) / 2) * width for x in range(len(names))],
               [max(e, 1e-12) for e in errs], width, color=shades[i % 3], edgecolor="black",
               label=dtype)
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("max |param - fp32 run| after the steps")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
