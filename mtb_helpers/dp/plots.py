"""Data-parallel figures: who holds which part of the flat buffers, the bytes each rank holds
(against the ZeRO paper's accounting) and the bytes it sends (against the formulas).

They draw the data of ``check_data_parallel`` reports (``report.extra["memory"]``, ``["communication"]``);
``plot_holdings`` needs only the strategy names. Errors per quantity: the shared ``plots.errors.plot_errors``.
They never start ranks.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from mtb_helpers.dp.strategies import MEMORY_SHARDED, MEMORY_TERMS
from mtb_helpers.dp.strategies import STRATEGIES
from mtb_helpers.plots.palette import EMPTY_COLOR, rank_color, rank_legend_handles
from mtb_helpers.plots.errors import plot_errors  # noqa: F401  (re-exported for notebook 06)
from mtb_helpers.plots.parts import legend_right, stacked_bar

__all__ = ["plot_holdings", "plot_memory", "plot_communication", "plot_errors", "TERM_COLORS",
           "NAMES"]

NAMES = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3 / FSDP"}
TERM_LABELS = {"params": "parameters", "grads": "gradients", "optimizer_state": "Adam state (exp_avg, exp_avg_sq)"}
# greys, so that a term is never mistaken for a rank colour
TERM_COLORS = {"params": "#4D4D4D", "grads": "#9A9A9A", "optimizer_state": "#DADADA"}
OP_COLORS = {"backward all_reduce": "#4D4D4D", "backward reduce_scatter": "#7A7A7A",
             "step all_gather": "#D0D0D0", "forward all_gather": "#F2E2B8",
             "backward all_gather": "#FFFFFF"}


def plot_holdings(world_size: int = 2, strategies=STRATEGIES) -> Figure:
    """One panel per strategy: for each of parameters, gradients and Adam state, one strip per rank
    along the flat buffer (index 0 to Ψ); coloured where the rank holds that part between steps."""
    strategies = tuple(strategies)
    t = world_size
    fig, axes = plt.subplots(1, len(strategies), figsize=(10, 1.2 + 0.42 * 3 * t), sharey=True)
    axes = [axes] if len(strategies) == 1 else list(axes)
    labels = []
    for ax, strategy in zip(axes, strategies):
        y = 0
        for term in MEMORY_TERMS:
            for r in range(t):
                ax.add_patch(Rectangle((0, y), 1, 0.8, facecolor=EMPTY_COLOR, edgecolor="none"))
                lo, hi = ((r / t, (r + 1) / t) if term in MEMORY_SHARDED[strategy] else (0, 1))
                ax.add_patch(Rectangle((lo, y), hi - lo, 0.8, facecolor=rank_color(r),
                                       edgecolor="white", linewidth=0.5))
                if strategy == strategies[0]:
                    labels.append((y + 0.4, f"{TERM_LABELS[term]}, rank {r}" if r == 0 else f"rank {r}"))
                y += 1
            y += 0.5
        ax.set_xlim(0, 1)
        ax.set_ylim(y, -0.3)
        ax.set_xticks([0, 1], ["0", "Ψ"])
        ax.set_xlabel("flat parameter index")
        ax.set_title(NAMES[strategy], fontsize=10)
        ax.spines[["top", "right", "left"]].set_visible(False)
    axes[0].set_yticks([p for p, _ in labels], [text for _, text in labels], fontsize=8)
    axes[0].tick_params(axis="y", length=0)
    fig.suptitle(f"Who holds what between steps, {t} data-parallel ranks "
                 f"(grey: not held; ZeRO-3 gathers parameters while a layer runs)", fontsize=10)
    fig.legend(handles=[*rank_legend_handles(t), Patch(facecolor=EMPTY_COLOR, label="not held")],
               loc="lower center", ncol=t + 1, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def _bars(reports):
    """(x, strategy, rank, data) for one bar per rank, grouped by strategy."""
    t = len(reports[0].records)
    width = 0.8 / t
    for i, rep in enumerate(reports):
        for r in range(t):
            yield i - 0.4 + width * (r + 0.5), rep.config["strategy"], r, rep, width * 0.9


def plot_memory(reports) -> Figure:
    """Bytes each rank holds after the step, stacked by term, one bar per rank (edge in the rank's
    colour) per strategy; our fp32 accounting (4Ψ + 4Ψ + 8Ψ) as a black bar, the ZeRO paper's
    mixed-precision one (2Ψ + 2Ψ + 12Ψ) as a white diamond."""
    fig, ax = plt.subplots(figsize=(10, 4.6))
    top = 0
    for x, strategy, r, rep, w in _bars(reports):
        mem = rep.extra["memory"]
        bottom = stacked_bar(ax, x, [(mem["per_rank"][r][term], {"color": TERM_COLORS[term]})
                                     for term in MEMORY_TERMS], w, sum(mem["ours"].values()),
                             edgecolor=rank_color(r), linewidth=2)
        ax.scatter([x], [sum(mem["paper_mixed_precision"].values())], marker="D", s=40,
                   facecolor="white", edgecolor="black", zorder=3)
        top = max(top, bottom, sum(mem["paper_mixed_precision"].values()))
    mem0 = reports[0].extra["memory"]
    t = len(reports[0].records)
    ax.set_xticks(range(len(reports)), [NAMES[r.config["strategy"]] for r in reports])
    ax.set_ylabel("bytes held per rank")
    ax.set_ylim(0, top * 1.15)
    ax.set_title(f"Memory per rank after the last Adam step, p = {t}, Ψ = {mem0['numel']} parameters "
                 f"({reports[0].config['dtype']}): measured vs Rajbhandari et al. 2020", fontsize=10)
    handles = [Patch(facecolor=TERM_COLORS[k], edgecolor="black", label=TERM_LABELS[k])
               for k in reversed(MEMORY_TERMS)]
    d = mem0["dtype_bytes"]
    handles += [Line2D([], [], color="black", linewidth=2.5,
                       label=f"ours: {d}Ψ + {d}Ψ + {2 * d}Ψ\n({reports[0].config['dtype']}, sharded)"),
                Line2D([], [], marker="D", color="black", markerfacecolor="white", linestyle="",
                       label="paper: 2Ψ + 2Ψ + 12Ψ\n(mixed precision)"),
                *rank_legend_handles(t)]
    legend_right(ax, handles)
    fig.tight_layout()
    return fig


def plot_communication(reports) -> Figure:
    """Bytes each rank sends in one step (ring), stacked by collective, one bar per rank; the
    formula as a black bar."""
    fig, ax = plt.subplots(figsize=(10, 4.2))
    used = []
    top = 0
    for x, strategy, r, rep, w in _bars(reports):
        comm = rep.extra["communication"]
        by_op = comm["per_rank"][r]["by_op"]
        used += [op for op in OP_COLORS if by_op.get(op)]
        bottom = stacked_bar(ax, x, [(by_op[op], {"color": OP_COLORS[op]}) for op in OP_COLORS if by_op.get(op)],
                             w, comm["formula"], edgecolor=rank_color(r), linewidth=2)
        top = max(top, bottom, comm["formula"])
    for i, rep in enumerate(reports):
        formula = rep.extra["communication"]["formula_text"].split(" ")[-1]   # e.g. 2(p-1)/p·eΨ
        ax.text(i, top * 1.04, formula,
                ha="center", va="bottom", fontsize=8)
    t = len(reports[0].records)
    ax.set_xticks(range(len(reports)), [NAMES[r.config["strategy"]] for r in reports])
    ax.set_ylabel("bytes sent per rank per step")
    ax.set_ylim(0, top * 1.2)
    ax.set_title(f"Bytes on the wire per step, p = {t}: the record of each rank vs the formula "
                 f"(e bytes per element)", fontsize=10)
    handles = [Patch(facecolor=OP_COLORS[op], edgecolor="black", label=op)
               for op in OP_COLORS if op in used]
    handles += [Line2D([], [], color="black", linewidth=2.5, label="formula"), *rank_legend_handles(t)]
    legend_right(ax, handles)
    fig.tight_layout()
    return fig
