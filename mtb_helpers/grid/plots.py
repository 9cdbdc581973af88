"""Figures of the TP x DP grid: who sits where, which group talks about what, and how many bytes.

They draw a ``check_grid`` report (its ``extra["grid"]`` and ``extra["traffic"]``); they never
start ranks. The grid has one row per data-parallel replica and one column per tensor-parallel
shard; rank r is drawn in its course colour. Tensor-parallel groups (rows) are outlined dashed,
data-parallel groups (columns) dotted; the panel on the right lists every group's collectives as
the ranks recorded them, and flags a gradient all-reduce that ran in the wrong group.
``plot_bytes`` (bytes per rank by group against the formulas) also draws the capstone's groups.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyBboxPatch, Patch, Rectangle

from mtb_helpers.plots.live import LiveFigure, Png
from mtb_helpers.plots.palette import FAIL_COLOR, rank_color, rank_legend_handles
from mtb_helpers.plots.parts import legend_right, stacked_bar

__all__ = ["plot_grid", "grid_png", "plot_grid_bytes", "grid_bytes", "plot_bytes", "group_lines"]

# The bytes figure's process groups (this grid's two, the capstone's five): greys and hatches, so
# that colour keeps meaning "rank" in every figure.
GROUP_COLORS = {"tp": "#4D4D4D", "sp": "#8C8C8C", "pp": "#BDBDBD", "cp": "#FFFFFF", "dp": "#E0E0E0"}
GROUP_HATCH = {"tp": "", "sp": "", "pp": "//", "cp": "xx", "dp": ".."}
GROUP_LABEL = {"tp": "TP (f, g, vocab CE)", "sp": "SP (gather / reduce-scatter, LN grads)",
               "pp": "PP (point-to-point)", "cp": "CP (ring K/V)", "dp": "DP (gradients, dp x cp)"}
TP_STYLE = {"edgecolor": "black", "linestyle": "--", "linewidth": 1.8}
DP_STYLE = {"edgecolor": "#555555", "linestyle": ":", "linewidth": 2.2}
GAP = 0.45   # space between cells, room for the two outlines


def group_lines(report) -> list[tuple[str, bool]]:
    """``(text, ok)`` lines for the figure's side panel: a header per group, then one line per
    kind of collective it ran, with calls and bytes per rank. ``ok`` is False for a gradient
    all-reduce outside a DP group, and for a missing one when dp > 1."""
    grid = report.extra["grid"]
    dp_groups = [tuple(g) for g in grid["dp_groups"]]
    traffic: dict[tuple, dict] = {}   # (group ranks, kind) -> the traffic of one member
    for rank_traffic in report.extra["traffic"]:
        for entry in rank_traffic:
            traffic.setdefault((tuple(entry["ranks"]), entry["kind"]), entry)
    lines = []
    for kind, groups in (("tp", grid["tp_groups"]), ("dp", grid["dp_groups"])):
        for i, ranks in enumerate(groups):
            lines.append((f"{kind.upper()} group {i}: ranks {list(ranks)}", True))
            ran = [(what, entry) for (who, what), entry in traffic.items()
                   if who == tuple(ranks) and not (kind == "tp" and what == "dp"
                                                  and who in dp_groups)]
            for what, entry in ran:
                label = "all-reduce (g fwd, f bwd)" if what == "tp" else "grad all-reduce"
                ok = what == "tp" or tuple(entry["ranks"]) in dp_groups
                lines.append((f"  {entry['all_reduces']} x {label}: {entry['bytes']} B in, "
                              f"{entry['sent']} B sent/rank" + ("" if ok else "  WRONG GROUP"), ok))
            if not ran:
                lines.append(("  nothing", kind == "tp" or grid["dp"] == 1))
    return lines


def _grid_key(data) -> tuple:
    report, figsize = data
    grid, cfg = report.extra["grid"], report.config
    return (grid["tp"], grid["dp"], cfg["batch"], cfg["ffn_hidden"], tuple(map(tuple, grid["coords"])),
            tuple(group_lines(report)), figsize)


def _build_grid(new_figure, data) -> dict:
    """The static layer: the rank cells, the groups, each group's collectives, the legend."""
    report, figsize = data
    grid, cfg = report.extra["grid"], report.config
    tp, dp = grid["tp"], grid["dp"]
    b, ffn = cfg["batch"], cfg["ffn_hidden"]
    fig = new_figure(figsize or (10, 2.3 + 1.1 * dp))
    ax = fig.add_axes([0.02, 0.06, 0.44, 0.78])
    side = fig.add_axes([0.47, 0.06, 0.52, 0.78])
    side.axis("off")
    step = 1 + GAP
    for rank, (d, j) in enumerate(grid["coords"]):
        x0, y0 = j * step, d * step
        ax.add_patch(Rectangle((x0, y0), 1, 1, facecolor=rank_color(rank), edgecolor="white",
                               linewidth=1))
        text = (f"rank {rank}\nX rows {d * b // dp}:{(d + 1) * b // dp}\n"
                f"ffn {j * ffn // tp}:{(j + 1) * ffn // tp}")
        ax.text(x0 + 0.5, y0 + 0.5, text, ha="center", va="center", fontsize=8.5 if tp < 4 else 7,
                color="white" if rank_color(rank) in ("#0072B2", "#D55E00", "#7F7F7F") else "black")
    for d in range(dp):           # TP groups: the rows, outlined close to the cells
        ax.add_patch(FancyBboxPatch((-0.1, d * step - 0.1), tp * step - GAP + 0.2, 1.2,
                                    boxstyle="round,pad=0,rounding_size=0.12", fill=False,
                                    **TP_STYLE))
        ax.text(-0.25, d * step + 0.5, f"TP {d}\nreplica {d}", ha="right", va="center",
                fontsize=9, fontweight="bold")
    for j in range(tp):           # DP groups: the columns, outlined a little further out
        ax.add_patch(FancyBboxPatch((j * step - 0.19, -0.19), 1.38, dp * step - GAP + 0.38,
                                    boxstyle="round,pad=0,rounding_size=0.15", fill=False,
                                    **DP_STYLE))
        ax.text(j * step + 0.5, dp * step - GAP + 0.27, f"DP {j}\nshard {j}", ha="center",
                va="top",
                fontsize=9, fontweight="bold", color="#555555")
    ax.set_xlim(-1.2, max(tp * step - GAP + 0.3, 2.6))
    ax.set_ylim(dp * step - GAP + 0.8, -0.3)
    ax.set_aspect("equal")
    ax.axis("off")
    lines = group_lines(report)
    box = side.get_position()
    height = min(0.21 / (box.height * fig.get_figheight()), 0.9 / max(len(lines), 1))
    for i, (text, ok) in enumerate(lines):
        side.text(0.0, 1.0 - i * height, text, ha="left", va="top", fontsize=8.5,
                  family="monospace", color="black" if ok else FAIL_COLOR,
                  fontweight="normal" if text.startswith(" ") else "bold",
                  transform=side.transAxes)
    handles = [*rank_legend_handles(tp * dp),
               Line2D([], [], color="black", linestyle="--", label="TP group (row)"),
               Line2D([], [], color="#555555", linestyle=":", linewidth=2.2,
                      label="DP group (column)"),
               Patch(facecolor="white", edgecolor=FAIL_COLOR, linewidth=2, label="rank fails")]
    ax.text(-1.2, dp * step - GAP + 0.75, "X rows: the replica's slice of the batch\n"
            "ffn: the shard's columns of W1 = rows of W2", fontsize=7.5, va="top", ha="left")
    side.legend(handles=handles, loc="lower left", ncol=4, fontsize=8, frameon=False)
    fig.suptitle("", fontsize=11)   # the verdict: set by every update
    return {"ax": ax, "step": step}


def _update_grid(fig: Figure, ctx: dict, data) -> list:
    """The values: a red frame on every failing rank, the verdict."""
    report, _ = data
    grid, cfg = report.extra["grid"], report.config
    failing = {row.rank for row in report.failed()}
    drawn = [ctx["ax"].add_patch(Rectangle((j * ctx["step"], d * ctx["step"]), 1, 1, fill=False,
                                           edgecolor=FAIL_COLOR, linewidth=3))
             for rank, (d, j) in enumerate(grid["coords"]) if rank in failing]
    verdict = "PASSED" if report.passed else "FAILED"
    fig.suptitle(f"tp={grid['tp']} x dp={grid['dp']} grid, rank = dp_index * tp + tp_index; "
                 f"bug={cfg.get('bug')}: check {verdict}", fontsize=11)
    return drawn + [fig._suptitle]


LIVE_GRID = LiveFigure(_grid_key, _build_grid, _update_grid)


def plot_grid(report, figsize: tuple[float, float] | None = None) -> Figure:
    """The ``tp x dp`` grid of ``report``: ranks as cells in their colours, what each holds, the
    TP groups (dashed rows) and DP groups (dotted columns), and each group's collectives."""
    return LIVE_GRID.figure((report, figsize))


def grid_png(report) -> Png:
    """``plot_grid`` for an explorer: the grid and its groups drawn once per shape, the red
    frames and the verdict on every redraw."""
    return LIVE_GRID.png((report, None))


def grid_bytes(report) -> dict:
    """A ``check_grid`` report's bytes sent per rank in its TP and DP group, measured and by
    ``grid.expected_bytes``, as ``plot_bytes`` draws them."""
    expected, kinds = report.extra["expected_bytes"], ("tp", "dp")
    sent = [{k: sum(e["sent"] for e in entries if e["kind"] == k) for k in kinds}
            for entries in report.extra["traffic"]]
    return {"groups": list(kinds), "per_rank": sent,
            "formula": [{k: expected[k]["sent"] for k in kinds}] * len(sent)}


def plot_grid_bytes(report) -> Figure:
    """Bytes each rank sent per step in its TP group and its DP group (stacked), against the
    formula of ``grid.expected_bytes`` (black tick)."""
    cfg = report.config
    return plot_bytes(grid_bytes(report), f"What each rank sends: tp={cfg['tp']} x dp={cfg['dp']}, "
                      f"h={cfg['hidden']}, ffn={cfg['ffn_hidden']}, batch={cfg['batch']}, "
                      f"{cfg['dtype']}", {"tp": "TP: g + f all-reduce", "dp": "DP: grad all-reduce"})


def plot_bytes(bytes_info: dict, title: str = "", labels: dict[str, str] = GROUP_LABEL) -> Figure:
    """Stacked bars: bytes each rank sent in one step, by group (measured); a black tick marks the
    formulas' total. ``bytes_info``: ``{"groups": [..], "per_rank": [{group: bytes}], "formula":
    [{group: bytes}]}``, a capstone report's ``extra["bytes"]`` or ``grid_bytes(report)``."""
    per_rank, formula = bytes_info["per_rank"], bytes_info["formula"]
    groups = bytes_info["groups"]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.8 * len(per_rank) + 3.5), 4.0))
    for r, sent in enumerate(per_rank):
        stacked_bar(ax, r, [(sent[g] / 1024, {"color": GROUP_COLORS[g], "hatch": GROUP_HATCH[g]})
                            for g in groups], 0.7, sum(formula[r].values()) / 1024,
                    edgecolor=rank_color(r), linewidth=1.5)
    highest = max(max(sum(sent.values()), sum(f.values())) for sent, f in zip(per_rank, formula))
    if highest:
        ax.set_ylim(0, highest / 1024 * 1.08)   # room above the tallest bar and formula tick
    else:   # every group has one rank: nothing to send, and a (0, 0) axis would be singular
        ax.set_ylim(0, 1)
        ax.text(0.5, 0.5, "no bytes sent: every group holds a single rank", transform=ax.transAxes,
                ha="center", va="center", fontsize=9)
    ax.set_xticks(range(len(per_rank)), [f"rank {r}" for r in range(len(per_rank))])
    for r, tick in enumerate(ax.get_xticklabels()):
        tick.set_color(rank_color(r))
    ax.set_xlabel("rank (bar outline in its colour)")
    ax.set_ylabel("KiB sent per training step")
    ax.set_title(title or "Bytes each rank sends per step, by process group")
    handles = [Patch(facecolor=GROUP_COLORS[g], hatch=GROUP_HATCH[g], edgecolor="black",
                     label=labels[g]) for g in groups]
    handles.append(Line2D([], [], color="black", linewidth=2.5, label="formulas' total"))
    legend_right(ax, handles, x=1.0)
    fig.tight_layout()
    return fig
