"""Figures of notebook 13: the calibration (log-log, the two regimes and n½ marked) and predicted
against measured times. Plain data in (a ``Calibration``, lists of numbers); rank colours are not
involved (these are per-collective and per-algorithm figures), so they use the palette's first
colours in a fixed order."""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from mtb_helpers.cost.calibrate import Calibration
from mtb_helpers.cost.model import _si, n_half, predict
from mtb_helpers.plots.palette import RANK_COLORS

__all__ = ["plot_calibration", "plot_predicted_vs_measured"]


def plot_calibration(cal: Calibration, collective: str = "all-reduce", title: str = "") -> Figure:
    """Measured median times (dots) and the fitted ``c_α·α + c_β·n/β`` (line) on log-log axes; the
    latency-bound sizes (left of the fitted n½ for this collective) and bandwidth-bound sizes
    shaded, n½ marked."""
    sizes, seconds = cal.measured(collective)
    fit = cal.fits[collective]
    p = 2 if collective == "send/recv" else cal.world_size
    grid = np.logspace(np.log10(min(sizes) / 2), np.log10(max(sizes) * 2), 200)
    fitted = [predict(collective, n, p, fit.link) for n in grid]
    half = n_half(collective, p, fit.link)
    fig, ax = plt.subplots(figsize=(8, 4.6))
    ax.axvspan(grid[0], min(half, grid[-1]), color="#EEEEEE", label="latency-bound (n < n½)")
    ax.loglog(grid, fitted, "-", color="black",
              label=f"fit: α = {fit.alpha * 1e6:.3g} µs, β = {fit.bandwidth / 1e9:.3g} GB/s")
    ax.loglog(sizes, seconds, "o", color=RANK_COLORS[0], markersize=7,
              label="measured (median of each size's runs)")
    if grid[0] < half < grid[-1]:
        ax.axvline(half, color=RANK_COLORS[5], linestyle="--",
                   label=f"n½ = {_si(half, 'B')}: latency term = bandwidth term")
    ax.set_xlabel("size n in bytes (nccl-tests' size)")
    ax.set_ylabel("time of one collective (s)")
    where = ("emulated link " + cal.link.describe()) if cal.link is not None else "this machine"
    ax.set_title(title or f"{collective} on {cal.world_size} gloo ranks, {where}: measured and "
                          "fitted", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def plot_predicted_vs_measured(xs: Sequence, predicted: dict[str, Sequence[float]],
                               measured: dict[str, Sequence[float]], xlabel: str, title: str,
                               unit: str = "ms") -> Figure:
    """One colour per series (e.g. per algorithm): the prediction as a line, written first, the
    measurement as dots on it; a dot off its line is the gap."""
    scale = {"ms": 1e3, "s": 1.0}[unit]
    fig, ax = plt.subplots(figsize=(8, 4.4))
    for i, name in enumerate(predicted):
        color = RANK_COLORS[i % len(RANK_COLORS)]
        ax.plot(xs, [t * scale for t in predicted[name]], "-", color=color, linewidth=2,
                label=f"{name}: predicted")
        ax.plot(xs, [t * scale for t in measured[name]], "o", color=color, markersize=8,
                markeredgecolor="black", label=f"{name}: measured")
    ax.set_xticks(list(xs))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"time ({unit})")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    return fig
