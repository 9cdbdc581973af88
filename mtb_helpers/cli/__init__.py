"""The ``minitrainbench`` command: the course's checks, headless, for terminals and CI.

Exit status: 0 when every check passes, 1 when one fails, 2 on bad arguments (argparse's own
convention, which ValueErrors raised by the checks' validation follow too).

Each topic of the manifest (:mod:`mtb_helpers.topics`) registers its commands with its
``cli.register(top, groups)``; ``groups`` maps a group name ("tp", "pp", ...) to the sub-parsers
of ``minitrainbench <group>``.
"""
from __future__ import annotations

import argparse
import sys

from mtb_helpers.topics import Topic, cli_groups, listed


def build_parser(topics: tuple[Topic, ...] | None = None) -> argparse.ArgumentParser:
    """The command line of every topic in the manifest: first the groups the topics open, then
    each topic's ``cli.register(top, groups)`` (a topic may add commands to another's group)."""
    parser = argparse.ArgumentParser(
        prog="minitrainbench",
        description="Run MiniTrainBench's checks on real gloo ranks (or inside torchrun).")
    top = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups = {}
    for name, help_text in cli_groups(topics).items():
        group = top.add_parser(name, help=help_text, description=help_text)
        groups[name] = group.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
    for topic in listed(topics):
        topic.module("cli").register(top, groups)
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
