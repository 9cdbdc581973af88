"""``minitrainbench grid check``: one SGD step of the TP MLP on a tp x dp grid, headless: the
report, then each group's traffic. A grid that is not the world size (under torchrun the launched
job's) is refused by the check, as shapes that do not divide."""
from __future__ import annotations

import argparse

from mtb_helpers.checking.command import add_check_options, add_command, check_command
from mtb_helpers.grid.check import check_grid


def register(top: argparse._SubParsersAction, groups: dict[str, argparse._SubParsersAction]) -> None:
    """Add ``check`` to ``minitrainbench grid``."""
    add_command(
        groups["grid"], "check", "one SGD step of the TP MLP on a tp x dp grid against one process",
        "Split the ranks into tensor-parallel groups (rows of the grid, neighbouring ranks, "
        "Megatron's order) and data-parallel groups (columns); run the TP MLP in each TP group on "
        "its replica's slice of the batch, average the gradients across each DP group, take one "
        "SGD step, and compare every rank's output, gradient shards and updated parameter shards "
        "with one process.", check_command(check_grid, _traffic),
        common=lambda parser: add_check_options(parser, world_size=4),
        tp=(2, "tensor-parallel size (default 2)"),
        dp=(2, "data-parallel size (default 2); tp x dp must equal the world size"),
        hidden=(8, "model width h (default 8)"), ffn_hidden=(16, "MLP width, split over tp (16)"),
        batch=(8, "batch rows, split over dp (8)"), lr=(0.1, "SGD learning rate (0.1)"))


def _traffic(report) -> str:
    lines = [f"grid: {report.extra['grid']['convention']}"]
    for rank, entries in enumerate(report.extra["traffic"]):
        lines.append(f"rank {rank}: " + "; ".join(f"{e['kind']} group {e['ranks']}: "
                                                  f"{e['all_reduces']} all-reduce(s), "
                                                  f"{e['sent']} B sent" for e in entries))
    return "\n".join(lines)
