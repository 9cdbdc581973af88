"""Options and output shared by the check commands."""
from __future__ import annotations

import argparse
import json
import os
from typing import Callable

from mtb_helpers.runtime.ranks import MAX_WORLD_SIZE


def add_check_options(parser: argparse.ArgumentParser, world_size: int = 2) -> None:
    """--world-size, --dtype, --seed, --bug, --json: the options every check command takes."""
    parser.add_argument("--world-size", type=int, default=world_size,
                        help=f"number of gloo ranks, 1..{MAX_WORLD_SIZE} (default {world_size}); "
                             "ignored under torchrun, which sets it")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bug", default=None,
                        help="inject a deliberate bug (see `python -c 'import mtb_helpers; "
                             "print(mtb_helpers.BUGS)'`); the check must then fail")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def is_primary() -> bool:
    """True unless this process is a non-zero rank of a torchrun job (only rank 0 prints)."""
    return int(os.environ.get("RANK", "0")) == 0


def print_json(reports: list) -> None:
    """The --json output of the check commands: ``{"passed": ..., "checks": [report, ...]}``,
    strict JSON (no NaN), one document however many checks ran."""
    print(json.dumps({"passed": all(r.passed for r in reports),
                      "checks": [r.to_dict() for r in reports]}, allow_nan=False))


def emit(reports: list, as_json: bool, details: Callable[[object], str] | None = None) -> int:
    """Print the reports (rank 0 only under torchrun): one JSON document with ``--json``, else each
    report's table followed by ``details(report)`` when given. Returns the exit status: 0 when
    every report passed, 1 otherwise."""
    if is_primary():
        if as_json:
            print_json(reports)
        else:
            print("\n\n".join(str(r) + (f"\n{details(r)}" if details else "") for r in reports))
    return 0 if all(r.passed for r in reports) else 1
