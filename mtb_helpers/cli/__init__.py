"""The ``minitrainbench`` command: the course's checks, headless, for terminals and CI. Its exit
status and its one JSON document under --json: checking/command.py (argparse's own refusals exit
2 too, ValueErrors raised by the checks' validation follow that convention).

Each topic of the manifest (:mod:`mtb_helpers.topics`) registers its commands with its
``cli.register(top, groups)``; ``groups`` maps a group name ("tp", "pp", ...) to the sub-parsers
of ``minitrainbench <group>``.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

_ARGPARSE_ERROR: list[str] = []   # argparse's last error message (the --json document quotes it)

if TYPE_CHECKING:
    import argparse

    from mtb_helpers.topics import Topic


def build_parser(topics: tuple[Topic, ...] | None = None) -> argparse.ArgumentParser:
    """The command line of every topic in the manifest: first the groups the topics open, then
    each topic's ``cli.register(top, groups)`` (a topic may add commands to another's group)."""
    import argparse   # here, not above: importing this module must cost nothing (main's Ctrl-C)

    from mtb_helpers.topics import cli_groups, listed

    class Parser(argparse.ArgumentParser):   # every sub-parser is one too (add_parser)
        """argparse's parser; its error message is kept for the --json document."""

        def error(self, message: str):
            _ARGPARSE_ERROR[:] = [message]
            super().error(message)

    parser = Parser(
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
    """The ``minitrainbench`` console script. Importing it imports no torch (``mtb_helpers`` loads
    lazily), so Ctrl-C is handled from here on: while the commands load and import torch, or run."""
    argv = sys.argv[1:] if argv is None else list(argv)
    as_json = "--json" in argv
    try:
        return _main(argv, as_json)
    except KeyboardInterrupt:   # between the steps run_command guards
        from mtb_helpers.checking.command import interrupted
        return interrupted(as_json)


def _main(argv: list[str], as_json: bool) -> int:
    from mtb_helpers.checking.command import (exit_on_interrupt, json_stdout, print_failure_json,
                                             run_command)

    _ARGPARSE_ERROR.clear()

    def parse() -> object:
        with exit_on_interrupt(as_json):   # the topics and torch load here
            parser = build_parser()
        return parser.parse_args(argv)
    try:
        args = run_command(parse, as_json)
    except SystemExit as exc:   # argparse: usage on stderr, exit 2 (0 after --help)
        if as_json and exc.code == 2:
            print_failure_json(None, "bad arguments: refused before any rank started",
                               "; ".join(_ARGPARSE_ERROR))
        raise
    if isinstance(args, int):   # interrupted while the commands were being loaded
        return args
    args.argv = argv   # a refusal quotes the options as typed (common.typed)
    with json_stdout(as_json):   # stdout: the document only; everything else to stderr
        return int(run_command(lambda: args.func(args), as_json))


if __name__ == "__main__":
    sys.exit(main())
