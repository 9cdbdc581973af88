"""``minitrainbench cp check``: the context-parallel check, headless: its report, then
:func:`details` (``--json``: the report's dict, which carries ``"cp"``)."""
from __future__ import annotations

import argparse

from mtb_helpers.checking.command import add_command, check_command
from mtb_helpers.cp.check import check_context_parallel


def register(top: argparse._SubParsersAction,
             groups: dict[str, argparse._SubParsersAction]) -> None:
    """Add ``check`` to ``minitrainbench cp``."""
    add_command(
        groups["cp"], "check", "ring or all-gather attention on sequence shards against one process",
        "Split the sequence of q, k, v [b, heads, s, d] over real gloo ranks, run ring attention "
        "(K/V blocks passed around the ranks, online softmax, a hand-written backward ring) or "
        "all-gather attention (K/V gathered, dK/dV reduce-scattered), and compare output, dQ, dK "
        "and dV on every rank with scaled_dot_product_attention on the full sequence; then print "
        "the work per rank, the bytes sent and the K/V held against the formulas.",
        check_command(check_context_parallel, details),
        variant={"choices": ("ring", "allgather"), "default": "ring",
                 "help": "ring attention or all-gather attention (ring)"},
        layout={"choices": ("contiguous", "zigzag"), "default": "contiguous",
                "help": "which positions each rank holds (contiguous)"},
        causal=(False, "causal mask (off)"),
        seq=(16, "sequence length s, divisible by cp (2·cp for zigzag) (16)"),
        heads=(2, "attention heads (2)"), head_dim=(4, "head dimension d (4)"),
        batch=(1, "batch size b (1)"))


def details(report) -> str:
    """Work, bytes and K/V memory per rank, each next to its formula."""
    cp = report.extra["cp"]
    work, sent = cp["work"], cp["bytes"]
    ranks = len(work["forward"])
    lines = ["", "per rank      " + "  ".join(f"rank {r:<6}" for r in range(ranks)),
             "scores        " + "  ".join(f"{w:<11}" for w in work["forward"])
             + f"  formula {work['expected']}, imbalance max/mean {work['imbalance']:.2f}"]
    for d in ("forward", "backward"):
        lines.append(f"{d + ' B':<14}" + "  ".join(f"{b:<11}" for b in sent[d])
                     + f"  formula {sent['formula'][d]}")
    lines.append("K/V held B    " + "  ".join(f"{b:<11}" for b in cp["kv_peak_bytes"])
                 + f"  formula {cp['kv_peak_formula']}")
    lines.append(f"bytes match the formulas: {'yes' if sent['matches_formula'] else 'NO'}; "
                 f"work matches: {'yes' if work['matches_formula'] else 'NO'}")
    return "\n".join(line.rstrip() for line in lines)

