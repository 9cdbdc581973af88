"""``minitrainbench grid check``: one SGD step of the TP MLP on a tp x dp grid, headless.

Prints the report table (or, with ``--json``, ``{"passed": ..., "checks": [report.to_dict()]}``)
and each group's traffic, and exits 0 when every row passes, 1 when one fails; a grid that does not
match the world size or shapes that do not divide raise ValueError before any rank starts (exit 2).
Under torchrun the world size is the launched job's and only rank 0 prints.
"""
from __future__ import annotations

import argparse

from mtb_helpers.checking.command import add_check_options, emit


def register(top: argparse._SubParsersAction, groups: dict[str, argparse._SubParsersAction]) -> None:
    """Add ``check`` to ``minitrainbench grid``."""
    check = groups["grid"].add_parser(
        "check", help="one SGD step of the TP MLP on a tp x dp grid against one process",
        description="Split the ranks into tensor-parallel groups (rows of the grid, neighbouring "
                    "ranks, Megatron's order) and data-parallel groups (columns); run the TP MLP "
                    "in each TP group on its replica's slice of the batch, average the gradients "
                    "across each DP group, take one SGD step, and compare every rank's output, "
                    "gradient shards and updated parameter shards with one process.")
    add_check_options(check, world_size=4)
    check.add_argument("--tp", type=int, default=2, help="tensor-parallel size (default 2)")
    check.add_argument("--dp", type=int, default=2, help="data-parallel size (default 2); "
                                                         "tp x dp must equal the world size")
    check.add_argument("--hidden", type=int, default=8, help="model width h (default 8)")
    check.add_argument("--ffn-hidden", type=int, default=16, help="MLP width, split over tp (16)")
    check.add_argument("--batch", type=int, default=8, help="batch rows, split over dp (8)")
    check.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (0.1)")
    check.set_defaults(func=run_check)


def run_check(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench grid check``."""
    from mtb_helpers.grid.check import check_grid

    report = check_grid(world_size=args.world_size, tp=args.tp, dp=args.dp, hidden=args.hidden,
                        ffn_hidden=args.ffn_hidden, batch=args.batch, lr=args.lr,
                        dtype=args.dtype, seed=args.seed, bug=args.bug)
    return emit([report], args.json, _traffic)


def _traffic(report) -> str:
    lines = [f"grid: {report.extra['grid']['convention']}"]
    for rank, entries in enumerate(report.extra["traffic"]):
        lines.append(f"rank {rank}: " + "; ".join(f"{e['kind']} group {e['ranks']}: "
                                                  f"{e['all_reduces']} all-reduce(s), "
                                                  f"{e['sent']} B sent" for e in entries))
    return "\n".join(lines)
