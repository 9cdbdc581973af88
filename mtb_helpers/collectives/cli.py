"""``minitrainbench collectives``: the five collectives on real ranks, checked and measured."""
from __future__ import annotations

import argparse

from mtb_helpers.checking.command import add_command, check_args, emit
from mtb_helpers.collectives.ops import COLLECTIVES
from mtb_helpers.collectives.check import check_collectives


def register(top: argparse._SubParsersAction, groups: dict[str, argparse._SubParsersAction]) -> None:
    """Add the top-level ``collectives`` command."""
    add_command(
        top, "collectives", "broadcast, all-reduce, all-gather, reduce-scatter, all-to-all: "
                            "checked against one process, bytes vs ring formulas",
        "Run the five collectives on gloo ranks, compare every rank's result with a "
        "single-process reference (exact: the inputs are integers) and print the bytes each rank "
        "sent next to the ring formula.", collectives,
        numel=(8, "elements n of the full tensor (all-gather's output, reduce-scatter's input); "
                  "must divide by the world size (default 8)"),
        collective={"action": "append", "choices": COLLECTIVES, "default": None,
                    "help": "check only this collective (repeatable; default: all five)"})


def collectives(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench collectives``; returns the exit code."""
    report = check_collectives(**check_args(args), numel=args.numel,
                               collectives=tuple(args.collective or COLLECTIVES))
    return emit([report], args.json)
