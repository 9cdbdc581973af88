"""``minitrainbench collectives``: the five collectives on real ranks, checked and measured."""
from __future__ import annotations

import argparse

from mtb_helpers.checking.command import add_check_options, emit
from mtb_helpers.collectives.ops import COLLECTIVES
from mtb_helpers.collectives.check import check_collectives


def register(top: argparse._SubParsersAction, groups: dict[str, argparse._SubParsersAction]) -> None:
    """Add the top-level ``collectives`` command."""
    parser = top.add_parser(
        "collectives", help="broadcast, all-reduce, all-gather, reduce-scatter, all-to-all: "
                            "checked against one process, bytes vs ring formulas",
        description="Run the five collectives on gloo ranks, compare every rank's result with a "
                    "single-process reference (exact: the inputs are integers) and print the "
                    "bytes each rank sent next to the ring formula.")
    add_check_options(parser)
    parser.add_argument("--numel", type=int, default=8,
                        help="elements n of the full tensor (all-gather's output, reduce-scatter's "
                             "input); must divide by the world size (default 8)")
    parser.add_argument("--collective", action="append", choices=COLLECTIVES, default=None,
                        help="check only this collective (repeatable; default: all five)")
    parser.set_defaults(func=collectives)


def collectives(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench collectives``; returns the exit code."""
    report = check_collectives(world_size=args.world_size, numel=args.numel, dtype=args.dtype,
                               seed=args.seed, bug=args.bug,
                               collectives=tuple(args.collective or COLLECTIVES))
    return emit([report], args.json)
