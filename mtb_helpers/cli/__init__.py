"""The ``minitrainbench`` command: the course's checks, headless, for terminals and CI.

Exit status: 0 when every check passes, 1 when one fails, 2 on bad arguments (argparse's own
convention, which ValueErrors raised by the checks' validation follow too).

Each submodule registers its commands with ``register(top, groups)``; ``groups`` maps a group
name ("tp", "pp", ...) to the sub-parsers of ``minitrainbench <group>``.
"""
from __future__ import annotations

import argparse
import importlib
import sys

GROUPS = {
    "tp": "tensor- and sequence-parallel checks (column, row, MLP, sequence)",
    "pp": "pipeline schedules and their bubble",
    "dp": "data parallelism: DDP, ZeRO-1/2, ZeRO-3/FSDP against one process, step by step",
    "moe": "expert parallelism: token dispatch and combine with all-to-all",
    "grid": "tensor x data parallelism on one grid of ranks",
    "cp": "context parallelism: ring and all-gather attention on sequence shards",
    "cost": "time: the α-β model's predictions and this machine's calibration",
}
# Each topic folder has a cli.py with register(top, groups); these are the topics it loads.
COMMAND_MODULES = ("collectives", "tp", "sp", "pp", "grid", "dp", "moe", "cp", "capstone", "cost")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minitrainbench",
        description="Run MiniTrainBench's checks on real gloo ranks (or inside torchrun).")
    top = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups = {}
    for name, help_text in GROUPS.items():
        group = top.add_parser(name, help=help_text, description=help_text)
        groups[name] = group.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
    for module in COMMAND_MODULES:
        importlib.import_module(f"mtb_helpers.{module}.cli").register(top, groups)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ValueError as exc:  # bad input found by a check's validation, before any rank started
        print(f"minitrainbench: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
