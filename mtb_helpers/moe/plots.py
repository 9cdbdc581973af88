"""Expert-parallel figures, drawn from ``check_moe``'s ``report.extra["moe"]``; no ranks started."""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.collections import LineCollection
from matplotlib.lines import Line2D
from matplotlib.patches import FancyBboxPatch, Patch

from mtb_helpers.plots.errors import LIVE_ERRORS, error_figure
from mtb_helpers.plots.live import LiveFigure, Png
from mtb_helpers.plots.palette import rank_color, rank_legend_handles
from mtb_helpers.plots.parts import legend_right, stacked_bar

__all__ = ["plot_routing", "plot_tokens_per_expert", "plot_all_to_all_bytes", "plot_moe_errors",
           "routing_png", "tokens_per_expert_png", "moe_errors_png"]

DROPPED = "#999999"


def _box(ax, x, y, w, h, color, text) -> None:
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02",
                                facecolor=color, edgecolor="black", linewidth=0.8, zorder=3))
    ax.text(x, y, text, ha="center", va="center", fontsize=9, zorder=4)


def _routing_key(data) -> tuple:
    moe, title = data
    return (tuple(moe["owner"]), tuple(moe["source_rank"]), moe["capacity"], title)


def _geometry(moe: dict) -> tuple:
    n, E, t = len(moe["experts"]), len(moe["owner"]), max(moe["owner"]) + 1
    return ([n - 1 - i for i in range(n)], [(n - 1) * (1 - (e + 0.5) / E) for e in range(E)],
            [(n - 1) * (1 - (r + 0.5) / t) for r in range(t)])


def _build_routing(new_figure, data):
    """The static layer: token, expert and rank boxes, expert -> owner lines, legend, title."""
    moe, title = data
    owner, src, n, E = moe["owner"], moe["source_rank"], len(moe["experts"]), len(moe["owner"])
    t = max(owner) + 1
    fig = new_figure((10, max(4.5, 0.28 * n + 1.5)))
    height = fig.get_figheight()
    # tight_layout's margins for this figure, fixed (no layout pass): legend on the right
    ax = fig.add_axes((0.07, 0.55 / height, 0.76, 1 - 0.95 / height))
    ty, ey, ry = _geometry(moe)
    for i in range(n):
        _box(ax, 0, ty[i], 0.55, 0.7, rank_color(src[i]), f"token {i}")
    for e in range(E):
        _box(ax, 2, ey[e], 0.6, 1.0, rank_color(owner[e]), f"expert {e}")
    ax.add_collection(LineCollection([[(2.3, ey[e]), (3.7, ry[owner[e]])] for e in range(E)],
                                     colors=[rank_color(owner[e]) for e in range(E)],
                                     linewidths=3, zorder=2))
    for r in range(t):
        _box(ax, 4, ry[r], 0.6, 1.4, rank_color(r), f"rank {r}")
    ax.set_xlim(-0.45, 4.45)
    ax.set_ylim(-1, n)
    ax.set_xticks([0, 2, 4], ["tokens (colour: rank holding them)", "experts (colour: owner)",
                              "ranks"])
    ax.set_yticks([])
    ax.spines[["top", "right", "left"]].set_visible(False)
    handles = [*rank_legend_handles(t), Line2D([], [], color="black", label="1st choice"),
               Line2D([], [], color="black", linestyle="--", label="2nd choice"),
               Line2D([], [], color=DROPPED, linestyle=":", marker="x", markeredgecolor="black",
                      label="dropped (capacity)")]
    legend_right(ax, handles, x=1.0)
    cap = moe["capacity"]
    ax.set_title(title or f"Who goes where: {n} tokens, {E} experts on {t} rank(s), capacity "
                 f"{'unlimited' if cap is None else f'{cap} per expert per rank'}", fontsize=11)
    return ax


def _update_routing(fig, ax, data) -> list:
    """The values: one line per choice (token -> expert), crosses on the dropped ones."""
    moe, _ = data
    experts, kept, owner = moe["experts"], moe["kept"], moe["owner"]
    ty, ey, _ = _geometry(moe)
    lines: dict[tuple, list] = {}  # (colour, style) -> segments: one LineCollection each
    crosses, drawn = [], []
    for i, choices in enumerate(experts):
        for j, e in enumerate(choices):
            ok = kept[i][j]
            style = ("-" if j == 0 else "--") if ok else ":"
            key = (rank_color(owner[e]) if ok else DROPPED, style)
            lines.setdefault(key, []).append([(0.3, ty[i]), (1.7, ey[e])])
            if not ok:
                crosses.append((1.6, ey[e] + 0.85 * (ty[i] - ey[e]) / 14))
    for (color, style), segments in lines.items():
        ok = style != ":"
        drawn.append(ax.add_collection(LineCollection(
            segments, colors=color, linestyles=style, zorder=2, linewidths=1.6 if ok else 1.2,
            alpha=0.85 if ok else 1.0)))
    if crosses:
        drawn += ax.plot(*zip(*crosses), linestyle="none", marker="x", color="black",
                         markersize=6, zorder=3)
    return drawn


LIVE_ROUTING = LiveFigure(_routing_key, _build_routing, _update_routing)


def plot_routing(moe: dict, title: str | None = None) -> Figure:
    """Token -> expert -> rank. Each line is one choice, in the colour of the rank it travels
    to; dashed for a second choice, grey dotted for a choice dropped by the capacity limit."""
    return LIVE_ROUTING.figure((moe, title))


def routing_png(moe: dict) -> Png:
    """``plot_routing`` for an explorer: the boxes drawn once per layout, the choices each time."""
    return LIVE_ROUTING.png((moe, None))


def _dropped(moe: dict) -> list[list[int]]:
    """``[source rank][expert]``: choices dropped by the capacity limit."""
    t, n = len(moe["tokens_per_expert"]), moe["tokens_per_rank"]
    dropped = [[0] * len(moe["owner"]) for _ in range(t)]
    for i, choices in enumerate(moe["experts"]):
        for j, e in enumerate(choices):
            if not moe["kept"][i][j]:
                dropped[i // n][e] += 1
    return dropped


def _tokens_key(moe: dict) -> tuple:
    most = max(k + d for kr, dr in zip(moe["tokens_per_expert"], _dropped(moe))
               for k, d in zip(kr, dr))
    top = max(most, moe["capacity"] or 0)
    return (tuple(moe["owner"]), len(moe["tokens_per_expert"]), moe["capacity"], top + 1 + top // 8)


def _build_tokens(new_figure, moe: dict):
    """The static layer: axes up to a whole number over the tallest bar, experts, legend."""
    owner, t, capacity, top = _tokens_key(moe)
    E = len(owner)
    fig = new_figure((9, 3.8))
    ax = fig.add_axes((0.08, 0.2, 0.68, 0.72))
    ax.set_xlim(-0.6, E - 0.4)
    ax.set_ylim(0, top)
    if capacity is not None:
        ax.axhline(capacity, color="black", linestyle="--", linewidth=1.2)
    ax.set_xticks(range(E), [f"expert {e}\n(on rank {owner[e]})" for e in range(E)])
    for tick, e in zip(ax.get_xticklabels(), range(E)):
        tick.set_color(rank_color(owner[e]))
    ax.set_ylabel("choices routed (from each rank)")
    ax.yaxis.get_major_locator().set_params(integer=True)
    handles = [Patch(facecolor=rank_color(r), edgecolor="black", label=f"kept, from rank {r}")
               for r in range(t)]
    handles.append(Patch(facecolor="white", edgecolor=DROPPED, hatch="///", label="dropped"))
    if capacity is not None:
        handles.append(Line2D([], [], color="black", linestyle="--", label="capacity per rank"))
    legend_right(ax, handles, x=1.0)
    return ax


def _update_tokens(fig, ax, moe: dict) -> list:
    """The values: kept bars in the source rank's colour, dropped ones hatched on top, title."""
    kept, dropped, t = moe["tokens_per_expert"], _dropped(moe), len(moe["tokens_per_expert"])
    width, drawn = 0.8 / t, []
    for r in range(t):
        x = [e + (r - (t - 1) / 2) * width for e in range(len(moe["owner"]))]
        drawn += ax.bar(x, kept[r], width, color=rank_color(r), edgecolor="black", linewidth=0.6)
        drawn += ax.bar(x, dropped[r], width, bottom=kept[r], color="white", edgecolor=DROPPED,
                        hatch="///", linewidth=0.6)
    ax.set_title(f"Tokens per expert: {sum(map(sum, kept))} choices kept, "
                 f"{sum(map(sum, dropped))} dropped", fontsize=11)
    return drawn + [ax.title]


LIVE_TOKENS = LiveFigure(_tokens_key, _build_tokens, _update_tokens)


def plot_tokens_per_expert(moe: dict) -> Figure:
    """For each expert, one bar per source rank: kept choices in the source rank's colour,
    dropped ones hatched grey on top; the dashed line is the capacity per expert per rank."""
    return LIVE_TOKENS.figure(moe)


def tokens_per_expert_png(moe: dict) -> Png:
    """``plot_tokens_per_expert`` for an explorer: axes once per layout, the bars each time."""
    return LIVE_TOKENS.png(moe)


def _stacked_by_destination(ax, matrix: list[list[int]], row_bytes: int, title: str) -> None:
    t = len(matrix)
    for r in range(t):   # the part that stays on rank r: dotted, pale
        stacked_bar(ax, r, [(matrix[r][q] * row_bytes, {"color": rank_color(q), "hatch": "..." if q == r else None,
                                                        "alpha": 0.45 if q == r else 1.0}) for q in range(t)],
                    0.6, edgecolor="black", linewidth=0.6)
    ax.set_xticks(range(t), [f"rank {r}" for r in range(t)])
    ax.set_xlabel("sending rank")
    ax.set_title(title, fontsize=10)


def plot_all_to_all_bytes(moe: dict) -> Figure:
    """Left, middle: bytes of rows each rank hands to each destination (colour) in the dispatch and
    the combine all-to-all; the dotted part stays on the rank. Right: forward bytes each rank sends
    (counts + dispatch + combine, from the record) against all-gather + reduce-scatter."""
    rows, rb, by = moe["dispatch_rows"], moe["row_bytes"], moe["bytes"]
    t = len(rows)
    combine = [[rows[q][r] for q in range(t)] for r in range(t)]
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.8))
    axes[1].sharey(axes[0])   # dispatch and combine on one scale
    _stacked_by_destination(axes[0], rows, rb, "dispatch: rows to the experts")
    _stacked_by_destination(axes[1], combine, rb, "combine: rows back home")
    axes[0].set_ylabel("bytes (by destination rank)")
    ax = axes[2]
    parts = [("counts", "#BBBBBB"), ("dispatch", "#555555"), ("combine", "#999999")]
    for r in range(t):
        stacked_bar(ax, r, [(by[name][r], {"color": color}) for name, color in parts], 0.6,
                    edgecolor=rank_color(r), linewidth=2)
    alt = by["all_gather_alternative"][0]
    ax.axhline(alt, color="black", linestyle="--", linewidth=1.2)
    ax.set_xticks(range(t), [f"rank {r}" for r in range(t)])
    ax.set_ylim(0, max([alt] + [sum(by[p][r] for p, _ in parts) for r in range(t)]) * 1.25 or 1)
    ax.set_xlabel("sending rank")
    ax.set_ylabel("bytes sent, forward")
    ax.set_title("forward total vs all-gather", fontsize=10)
    handles = [*rank_legend_handles(t),
               Patch(facecolor="white", edgecolor="black", hatch="...", label="stays local"),
               *[Patch(facecolor=c, label=f"{name} all-to-all") for name, c in parts],
               Line2D([], [], color="black", linestyle="--", label="all-gather +\nreduce-scatter")]
    fig.legend(handles=handles, fontsize=8, loc="center left", bbox_to_anchor=(0.84, 0.5))
    fig.suptitle("Bytes each rank sends in the all-to-alls (forward; backward mirrors them)",
                 fontsize=11)
    fig.tight_layout(rect=(0, 0, 0.84, 1))
    return fig


def expert_group(quantity: str) -> str:
    """An expert's four grads share one column: ``experts.1.fc1.weight_grad`` -> ``experts.1 grads``."""
    return ".".join(quantity.split(".")[:2]) + " grads" if quantity.startswith("experts.") else quantity


def _moe_error_figure(report):
    t, bug = report.config["world_size"], report.config.get("bug")
    verdict = "passed" if report.passed else "FAILED"
    return error_figure(
        report, "quantity", group=expert_group,
        title=f"MoE check ({report.config['dtype']}, {t} rank(s){', bug ' + bug if bug else ''})"
              f": {verdict}",
        xlabel="quantity (expert grads: fc1/fc2 weight and bias, on the owning rank)")


def plot_moe_errors(report) -> Figure:
    """Max abs error vs one process on a log scale, one point per (quantity, rank) in the rank's
    colour; the four grads of an expert share one position; red frames fail, a cross is missing
    (the shared ``plots.errors`` figure)."""
    return LIVE_ERRORS.figure(_moe_error_figure(report))


def moe_errors_png(report) -> Png:
    """``plot_moe_errors`` for an explorer (see ``plots.errors``)."""
    return LIVE_ERRORS.png(_moe_error_figure(report))
