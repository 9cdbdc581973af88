"""Context-parallel figures, drawn from ``check_context_parallel``'s ``report.extra["cp"]`` (plain
data); no ranks started here."""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from mtb_helpers.plots.live import LiveFigure, Png
from mtb_helpers.plots.palette import EMPTY_COLOR, rank_color, rank_legend_handles
from mtb_helpers.plots.parts import legend_right

__all__ = ["plot_layout", "plot_ring_steps", "plot_work", "plot_cost"]


def plot_layout(positions: dict[str, list[list[int]]]) -> Figure:
    """One strip per layout: position p coloured by the rank that holds it."""
    fig, ax = plt.subplots(figsize=(9, 0.9 + 0.7 * len(positions)))
    ranks = 0
    for y, (name, by_rank) in enumerate(positions.items()):
        ranks = max(ranks, len(by_rank))
        for r, held in enumerate(by_rank):
            for p in held:
                ax.add_patch(Rectangle((p, -y - 0.4), 1, 0.8, facecolor=rank_color(r),
                                       edgecolor="white", linewidth=1))
    seq = sum(len(h) for h in next(iter(positions.values())))
    ax.set_xlim(0, seq)
    ax.set_ylim(-len(positions) + 0.5, 0.5)
    ax.set_yticks([-y for y in range(len(positions))], list(positions))
    ax.set_xlabel("sequence position")
    ax.set_ylabel("layout")
    ax.set_title("Which positions each rank holds (the sequence dim of q, k, v)")
    legend_right(ax, rank_legend_handles(ranks))
    fig.tight_layout()
    return fig


def plot_ring_steps(cp: dict, title: str = "") -> Figure:
    """Left: rank (row) x step (column), each cell in the colour of the rank whose K/V block it
    holds; hatched grey when the causal mask hides that whole block. Right: the running max of
    each rank's last query row after each step (it can only grow; each growth rescales acc)."""
    return LIVE_RING.figure((cp, title))


def ring_steps_png(cp: dict, title: str = "") -> Png:
    """``plot_ring_steps`` for an explorer: drawn once per picture (every value in it is in the
    key: the same setting moved back to shows its kept pixels)."""
    return LIVE_RING.png((cp, title))


def _ring_key(data) -> tuple:
    cp, title = data
    return title, tuple(tuple((s["step"], s["source"], s["pairs"], tuple(s["running_max"]))
                              for s in row) for row in cp["steps"])


def _draw_ring_steps(new_figure, data) -> None:
    cp, title = data
    steps = cp["steps"]
    ranks = len(steps)
    fig = new_figure((12, 1.8 + 0.7 * ranks))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.2, 1]})
    for r, row in enumerate(steps):
        for s in row:
            skipped = s["pairs"] == 0
            left.add_patch(Rectangle((s["step"], r), 0.94, 0.9, facecolor=EMPTY_COLOR if skipped
                                     else rank_color(s["source"]), edgecolor="black",
                                     hatch="//" if skipped else None, linewidth=0.8))
            left.text(s["step"] + 0.47, r + 0.45,
                      f"K/V of rank {s['source']}\n" + ("skipped" if skipped
                                                        else f"{s['pairs']} chunk pair(s)"),
                      ha="center", va="center", fontsize=8,
                      bbox=dict(facecolor=EMPTY_COLOR, edgecolor="none", pad=1) if skipped else None)
    left.set_xlim(-0.05, ranks)
    left.set_ylim(ranks, -0.1)
    left.set_xticks([i + 0.47 for i in range(ranks)], [str(i) for i in range(ranks)])
    left.set_yticks([r + 0.45 for r in range(ranks)], [f"rank {r}" for r in range(ranks)])
    left.set_xlabel("ring step (a block moves one rank on after each)")
    left.set_ylabel("rank (its queries stay here)")
    left.set_title("K/V block held at each step")
    legend_right(left, rank_legend_handles(ranks) + [Patch(facecolor=EMPTY_COLOR, hatch="//",
                                                           edgecolor="black", label="masked")],
                 x=1.0, fontsize=7, title="block from", title_fontsize=8)
    for r, row in enumerate(steps):
        xs = [s["step"] for s in row]
        ys = [s["running_max"][-1] for s in row]
        right.plot(xs, ys, color=rank_color(r), linewidth=2, linestyle="-" if r % 2 == 0 else "--")
        for i, (x, y) in enumerate(zip(xs, ys)):
            grew = i == 0 or y > ys[i - 1]
            right.plot([x], [y], marker="o", markersize=8, color=rank_color(r),
                       markerfacecolor=rank_color(r) if grew else "white", markeredgewidth=2)
    right.set_xticks(range(ranks))
    right.set_xlabel("ring step")
    right.set_ylabel("running max mx (last query row)")
    right.set_title("Online softmax: running max per rank")
    legend_right(right, [Line2D([], [], color=rank_color(r), linewidth=2, label=f"rank {r}",
                                linestyle="-" if r % 2 == 0 else "--") for r in range(ranks)]
                 + [Line2D([], [], marker="o", linestyle="", color="black", label="max grew: rescale"),
                    Line2D([], [], marker="o", linestyle="", color="black",
                           markerfacecolor="white", label="unchanged")], fontsize=7)
    fig.suptitle(title or "Ring attention, step by step", fontsize=12)
    fig.tight_layout()   # once per picture


LIVE_RING = LiveFigure(_ring_key, _draw_ring_steps, lambda fig, ctx, data: [])


def plot_work(work_by_layout: dict[str, list[int]], title: str = "") -> Figure:
    """Grouped bars: scores computed per rank, one group per layout, the group's mean dashed."""
    return LIVE_WORK.figure((work_by_layout, title))


def work_png(work_by_layout: dict[str, list[int]], title: str = "") -> Png:
    """``plot_work`` for an explorer: drawn once per picture (every value is in the key)."""
    return LIVE_WORK.png((work_by_layout, title))


def _draw_work(new_figure, data) -> None:
    work_by_layout, title = data
    fig = new_figure((8, 3.8))
    ax = fig.subplots()
    ranks = max(len(w) for w in work_by_layout.values())
    width = 0.8 / ranks
    for g, (name, work) in enumerate(work_by_layout.items()):
        for r, w in enumerate(work):
            ax.bar(g + (r - (ranks - 1) / 2) * width, w, width * 0.95, color=rank_color(r),
                   edgecolor="black", linewidth=0.5)
        mean = sum(work) / len(work)
        ax.plot([g - 0.45, g + 0.45], [mean, mean], color="black", linestyle="--", linewidth=1.2)
        ax.text(g, max(work) * 1.03, f"max/mean {max(work) / mean:.2f}", ha="center", fontsize=9)
    ax.set_xticks(range(len(work_by_layout)), list(work_by_layout))
    ax.set_ylim(0, max(max(w) for w in work_by_layout.values()) * 1.18)
    ax.set_xlabel("layout")
    ax.set_ylabel("attention scores computed\nper (batch, head)")
    ax.set_title(title or "Work per rank under a causal mask")
    legend_right(ax, rank_legend_handles(ranks) + [Line2D([], [], color="black", linestyle="--",
                                                          label="mean")])
    fig.tight_layout()   # once per picture


LIVE_WORK = LiveFigure(lambda data: (tuple((k, tuple(v)) for k, v in data[0].items()), data[1]),
                       _draw_work, lambda fig, ctx, data: [])


def plot_cost(cost: dict[str, dict[str, list]], shard_label: str = "per rank") -> Figure:
    """``cost[variant] = {"cp": [...], "sent": [...], "kv": [...], "measured_sent": [...],
    "measured_kv": [...]}`` (bytes per rank, forward + backward): lines from the formulas,
    dots measured on real ranks."""
    fig, (sent_ax, kv_ax) = plt.subplots(1, 2, figsize=(11, 3.8))
    styles = {"ring": ("-", "o"), "allgather": ("--", "s")}
    for variant, c in cost.items():
        line, marker = styles.get(variant, ("-", "o"))
        for ax, key in ((sent_ax, "sent"), (kv_ax, "kv")):
            ax.plot(c["cp"], c[key], color="black", linestyle=line, label=f"{variant} (formula)")
            if c.get(f"measured_{key}"):
                ax.plot(c["cp"], c[f"measured_{key}"], linestyle="", marker=marker, markersize=8,
                        markerfacecolor="white", markeredgecolor="black",
                        label=f"{variant} (measured)")
    for ax, what in ((sent_ax, "bytes sent per rank (forward + backward)"),
                     (kv_ax, "most K/V bytes held at once per rank")):
        ax.set_xlabel("world size cp")
        ax.set_ylabel("bytes")
        ax.set_title(what, fontsize=11)
        ax.set_xticks(cost[next(iter(cost))]["cp"])
        ax.set_ylim(bottom=0)   # from zero, so a halving looks like a halving
        ax.legend(fontsize=8)
    fig.suptitle(f"Ring vs all-gather attention: communication and memory, {shard_label}",
                 fontsize=12)
    fig.tight_layout()
    return fig
