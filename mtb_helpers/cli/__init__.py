"""The ``minitrainbench`` command: the course's checks, headless, for terminals and CI.

Exit status: 0 when every check passes, 1 when one fails, 2 on bad arguments (argparse's own
convention, which ValueErrors raised by the checks' validation follow too), 130 when interrupted
(Ctrl-C: one line, no traceback). With --json stdout is one JSON document whatever the outcome
(cli/common.py: run_command); whatever else is printed meanwhile goes to stderr (json_stdout).

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
    from mtb_helpers.cli.common import json_stdout, print_failure_json, run_command
    argv = sys.argv[1:] if argv is None else list(argv)
    as_json = "--json" in argv
    try:
        args = run_command(lambda: build_parser().parse_args(argv), as_json)
    except SystemExit as exc:   # argparse: usage on stderr, exit 2 (0 after --help)
        if as_json and exc.code == 2:
            print_failure_json(None, "bad arguments: argparse's message is on stderr")
        raise
    if isinstance(args, int):   # interrupted while the commands were being loaded
        return args
    with json_stdout(as_json):   # stdout: the document only; everything else to stderr
        return int(run_command(lambda: args.func(args), as_json))


if __name__ == "__main__":
    sys.exit(main())
