"""Figures of notebook 10: who holds which heads, the f/g pair around attention, who owns which
tokens, and the three all-reduces of the vocab-parallel cross-entropy.

Each draws plain numbers or tensors (never starts ranks, never runs a check); rank r always has
``rank_color(r)``. The step trace figures of a check's report are ``mtb_helpers.tp.plots``'s.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyBboxPatch, Patch, Rectangle

from mtb_helpers.plots.palette import EMPTY_COLOR, rank_color, rank_legend_handles
from mtb_helpers.plots.parts import legend_right

__all__ = ["plot_head_split", "plot_attention_flow", "plot_vocab_split", "plot_ce_allreduces"]


def _owner(index: int, size: int, world_size: int) -> int:
    return index // (size // world_size)


def plot_head_split(n_heads: int, head_dim: int, world_size: int) -> Figure:
    """``Wq, Wk, Wv`` as ``[h, h]`` (math layout ``W = weight.T``: a head is a block of ``d``
    columns) and ``Wo`` (a head reads a block of ``d`` rows), each head filled in its owner's colour."""
    h = n_heads * head_dim
    fig, axes = plt.subplots(1, 4, figsize=(11, 3.4))
    for ax, name in zip(axes, ("Wq", "Wk", "Wv", "Wo")):
        for head in range(n_heads):
            r = _owner(head, n_heads, world_size)
            lo = head * head_dim
            box = (lo, 0, head_dim, h) if name != "Wo" else (0, lo, h, head_dim)
            ax.add_patch(Rectangle(box[:2], box[2], box[3], facecolor=rank_color(r),
                                   edgecolor="white", linewidth=1.5))
            mid = lo + head_dim / 2
            xy = (mid, h / 2) if name != "Wo" else (h / 2, mid)
            ax.text(*xy, f"head {head}", ha="center", va="center", fontsize=7,
                    rotation=90 if name != "Wo" else 0, color="white")
        ax.set_xlim(0, h)
        ax.set_ylim(h, 0)
        ax.set_aspect("equal")
        ax.set_title(f"{name} [{h}, {h}]" + ("\nheads = column blocks" if name != "Wo"
                                             else "\nheads = row blocks"), fontsize=9)
        ax.set_xlabel("output feature" if name != "Wo" else "output feature (all ranks)",
                      fontsize=8)
        ax.set_ylabel("input feature", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle(f"{n_heads} heads of d={head_dim} on {world_size} ranks: each rank owns "
                 f"{n_heads // world_size} whole heads", fontsize=11)
    fig.legend(handles=rank_legend_handles(world_size), loc="lower center", ncol=world_size,
               fontsize=8)
    fig.tight_layout(rect=(0, 0.09, 1, 0.95))
    fig.subplots_adjust(bottom=0.25)
    return fig


def plot_attention_flow(world_size: int, n_heads: int) -> Figure:
    """One lane per rank: X -> f -> [Q_r K_r V_r] -> attention on its heads -> C_r @ Wo_r ->
    g -> Y. f and g are the only places the lanes meet (bars across every lane)."""
    t, local = world_size, n_heads // world_size
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.9 * t))
    stages = [("X\n[s,b,h]", "replicated"), ("Q_r, K_r, V_r\n[s,b,3h/t]", "own"),
              (f"attention\n{local} head(s)", "own"), ("C_r\n[s,b,h/t]", "own"),
              ("C_r Wo_r\npartial [s,b,h]", "partial"), ("Y = sum of the\npartials + bo", "replicated")]
    w, xs = 1.8, [0, 2.6, 4.8, 7.0, 9.2, 11.8]
    for r in range(t):
        y = t - 1 - r
        for (label, kind), x in zip(stages, xs):
            color = EMPTY_COLOR if kind == "replicated" else rank_color(r)
            ax.add_patch(FancyBboxPatch((x, y + 0.15), w, 0.7, boxstyle="round,pad=0.02", facecolor=color,
                                        edgecolor="black", linewidth=0.8))
            if kind == "partial":
                ax.add_patch(Rectangle((x, y + 0.15), w, 0.7, fill=False, hatch="//",
                                       edgecolor="white", linewidth=0))
            ax.text(x + w / 2, y + 0.5, label, ha="center", va="center", fontsize=8,
                    color="black" if kind == "replicated" else "white",
                    bbox={"facecolor": "black", "alpha": 0.35, "edgecolor": "none", "pad": 1}
                    if kind == "partial" else None)
        for x0, x1 in zip(xs[:-1], xs[1:]):
            ax.annotate("", (x1, y + 0.5), (x0 + w, y + 0.5),
                        arrowprops={"arrowstyle": "->", "color": "black", "lw": 0.8})
    for x, name, text in ((2.2, "f", "f: forward identity\nbackward all-reduce dX"),
                          (11.4, "g", "g: forward all-reduce\nbackward identity")):
        ax.add_patch(Rectangle((x - 0.12, 0.05), 0.24, t - 0.1, facecolor="black"))
        ax.text(x, t + 0.05, text, ha="center", va="bottom", fontsize=8)
        ax.text(x, -0.1, name, ha="center", va="top", fontsize=11, fontweight="bold")
    ax.set_xlim(-0.2, 13.8)
    ax.set_ylim(-0.5, t + 0.75)
    ax.set_yticks([t - 1 - r + 0.5 for r in range(t)], [f"rank {r}" for r in range(t)])
    ax.set_xticks([])
    ax.set_xlabel("forward, left to right (backward runs right to left)")
    ax.set_ylabel("rank")
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_title(f"Tensor-parallel attention on {t} ranks: one f, one g, nothing in between",
                 fontsize=11)
    handles = [*rank_legend_handles(t), Patch(facecolor=EMPTY_COLOR, edgecolor="black",
                                              label="replicated (same on every rank)"),
               Patch(facecolor="grey", hatch="//", edgecolor="white", label="partial sum")]
    legend_right(ax, handles, x=1.0)
    fig.tight_layout()
    return fig


def plot_vocab_split(ids, vocab: int, world_size: int) -> Figure:
    """Left: which rank owns each row of the table ``W_emb [vocab, h]``. Right: the token ids, each cell
    in the colour of the rank that owns that token (the only rank whose lookup is not zero)."""
    ids = np.asarray(ids)
    grid = ids.reshape(ids.shape[0], -1)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6),
                                      gridspec_kw={"width_ratios": [1, 2.2]})
    for v in range(vocab):
        left.add_patch(Rectangle((0, v), 1, 1, facecolor=rank_color(_owner(v, vocab, world_size)),
                                 edgecolor="white"))
        left.text(0.5, v + 0.5, str(v), ha="center", va="center", fontsize=7, color="white")
    left.set_xlim(0, 1)
    left.set_ylim(vocab, 0)
    left.set_yticks(range(0, vocab + 1, max(1, vocab // 6)))
    left.set_xticks([])
    left.set_ylabel("token id = row of W_emb")
    left.set_xlabel("W_emb [vocab, h] rows")
    left.set_title(f"W_emb split by vocabulary:\nrank r owns {vocab // world_size} rows", fontsize=9)
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            tok = int(grid[i, j])
            right.add_patch(Rectangle((j, i), 1, 1, edgecolor="white",
                                      facecolor=rank_color(_owner(tok, vocab, world_size))))
            right.text(j + 0.5, i + 0.5, str(tok), ha="center", va="center", fontsize=9,
                       color="white")
    right.set_xlim(0, grid.shape[1])
    right.set_ylim(grid.shape[0], 0)
    right.set_aspect("equal")
    right.set_xlabel("batch")
    right.set_ylabel("position")
    right.set_title("token ids, coloured by the rank that owns them:\nthe others give zero rows; "
                    "one all-reduce sums", fontsize=9)
    fig.suptitle(f"Vocab-parallel embedding, vocab={vocab} on {world_size} ranks", fontsize=11)
    fig.legend(handles=rank_legend_handles(world_size), loc="lower center", ncol=world_size,
               fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 0.93))
    return fig


OPS = (("max", "all-reduce (max)", "each rank's max of its own logits", "mx = max over ranks"),
       ("sum_exp", "all-reduce (sum)", "each rank's sum of exp(z - mx)", "sum_exp = sum over ranks"),
       ("target_logit", "all-reduce (sum)", "z_target - mx on the rank that owns it, else 0",
        "target_logit = sum over ranks"))


def plot_ce_allreduces(local: dict, combined: dict) -> Figure:
    """The three all-reduces of the loss, one panel each. ``local[name]`` is ``[t, N]`` (what each
    rank contributes for each of N tokens), ``combined[name]`` is ``[N]`` (what every rank holds
    after the all-reduce); names ``max``, ``sum_exp``, ``target_logit``."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    t = np.asarray(local["max"]).shape[0]
    width = 0.8 / t
    for i, (ax, (name, op, what, formula)) in enumerate(zip(axes, OPS), start=1):
        parts = np.asarray(local[name], dtype=float)
        n = parts.shape[1]
        for r in range(t):
            ax.bar(np.arange(n) - 0.4 + width * (r + 0.5), parts[r], width, color=rank_color(r))
        ax.scatter(np.arange(n), np.asarray(combined[name], dtype=float), marker="_", s=300,
                   color="black", linewidths=2.5, zorder=3)
        ax.axhline(0, color="black", linewidth=0.5)
        ax.set_xticks(range(n))
        ax.set_xlabel("token")
        ax.set_ylabel(name)
        ax.set_title(f"{i}. {op}: {formula}\nbars: {what}", fontsize=9)
    handles = [*rank_legend_handles(t),
               Line2D([], [], color="black", marker="_", linestyle="none", markersize=16,
                      markeredgewidth=2.5, label="every rank after the all-reduce")]
    fig.legend(handles=handles, loc="lower center", ncol=t + 1, fontsize=8)
    fig.suptitle("Vocab-parallel cross-entropy: three all-reduces of one number per token "
                 "([N], never [N, vocab]); loss = log sum_exp - target_logit", fontsize=11)
    fig.tight_layout(rect=(0, 0.08, 1, 0.93))
    return fig
