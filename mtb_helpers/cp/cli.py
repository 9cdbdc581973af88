"""``minitrainbench cp check``: the context-parallel check, headless.

Prints the report table, then :func:`details`; or with ``--json`` ``{"passed": ..., "checks":
[report.to_dict()]}`` (the dict carries ``"cp"``). Exit status and torchrun as every check
command (``checking/command.py``).
"""
from __future__ import annotations

import argparse

from mtb_helpers.checking.command import add_check_options, emit


def register(top: argparse._SubParsersAction,
             groups: dict[str, argparse._SubParsersAction]) -> None:
    """Add ``check`` to ``minitrainbench cp``."""
    parser = groups["cp"].add_parser(
        "check", help="ring or all-gather attention on sequence shards against one process",
        description="Split the sequence of q, k, v [b, heads, s, d] over real gloo ranks, run "
                    "ring attention (K/V blocks passed around the ranks, online softmax, a "
                    "hand-written backward ring) or all-gather attention (K/V gathered, dK/dV "
                    "reduce-scattered), and compare output, dQ, dK and dV on every rank with "
                    "scaled_dot_product_attention on the full sequence; then print the work per "
                    "rank, the bytes sent and the K/V held against the formulas.")
    add_check_options(parser)
    parser.add_argument("--variant", choices=("ring", "allgather"), default="ring",
                        help="ring attention or all-gather attention (ring)")
    parser.add_argument("--layout", choices=("contiguous", "zigzag"), default="contiguous",
                        help="which positions each rank holds (contiguous)")
    parser.add_argument("--causal", action="store_true", help="causal mask (off)")
    parser.add_argument("--seq", type=int, default=16,
                        help="sequence length s, divisible by cp (2·cp for zigzag) (16)")
    parser.add_argument("--heads", type=int, default=2, help="attention heads (2)")
    parser.add_argument("--head-dim", type=int, default=4, help="head dimension d (4)")
    parser.add_argument("--batch", type=int, default=1, help="batch size b (1)")
    parser.set_defaults(func=run_check)


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


def run_check(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench cp check``; returns the exit code."""
    from mtb_helpers.cp.check import check_context_parallel

    report = check_context_parallel(world_size=args.world_size, seq=args.seq, heads=args.heads,
                                    head_dim=args.head_dim, causal=args.causal,
                                    variant=args.variant, layout=args.layout, dtype=args.dtype,
                                    seed=args.seed, bug=args.bug, batch=args.batch)
    return emit([report], args.json, details)
