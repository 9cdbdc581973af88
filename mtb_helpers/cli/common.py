"""Options and output shared by the check commands, and how a command ends whatever happens.

Exit status: 0 every check passed, 1 a check failed (a rank raised or hung included), 2 bad
arguments, 130 interrupted (Ctrl-C). With ``--json`` stdout holds exactly one JSON document in
every one of these cases: ``{"passed": ..., "checks": [...]}``, plus ``"error": {"type",
"diagnosis", "message"}`` when the command did not get as far as a report."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
from typing import Callable, Iterator


def add_check_options(parser: argparse.ArgumentParser, world_size: int = 2) -> None:
    """--world-size, --dtype, --seed, --bug, --json: the options every check command takes."""
    from mtb_helpers.runtime.ranks import MAX_WORLD_SIZE   # torch: not before main() guards Ctrl-C
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


_DOCUMENT_STREAM: list = []   # the real stdout while a --json command runs (json_stdout)


@contextlib.contextmanager
def json_stdout(as_json: bool) -> Iterator[None]:
    """Under ``--json`` stdout carries the document and nothing else: what is printed meanwhile
    (the ranks' relayed output, the emulated link's notes for students) goes to stderr, and
    :func:`print_document` writes to the stdout saved here."""
    if not as_json:
        yield
        return
    _DOCUMENT_STREAM.append(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _DOCUMENT_STREAM.pop()


def print_document(document: object, **dumps_options) -> None:
    """Write one strict JSON document (no NaN) to the command's stdout, even inside
    :func:`json_stdout`."""
    stream = _DOCUMENT_STREAM[-1] if _DOCUMENT_STREAM else sys.stdout
    print(json.dumps(document, allow_nan=False, **dumps_options), file=stream, flush=True)


def print_json(reports: list) -> None:
    """The --json output of the check commands: ``{"passed": ..., "checks": [report, ...]}``,
    strict JSON (no NaN), one document however many checks ran."""
    print_document({"passed": all(r.passed for r in reports),
                    "checks": [r.to_dict() for r in reports]})


def failure_document(exc: BaseException | None, diagnosis: str) -> dict:
    """The --json document of a command that ended without a report: what happened and why."""
    return {"passed": False, "checks": [],
            "error": {"type": type(exc).__name__ if exc is not None else None,
                      "diagnosis": diagnosis, "message": str(exc) if exc is not None else ""}}


def print_failure_json(exc: BaseException | None, diagnosis: str) -> None:
    print_document(failure_document(exc, diagnosis))


def run_command(func: Callable[[], object], as_json: bool):
    """``func()``'s result; what ends it early becomes one stderr line (and, with ``--json``, one
    JSON document on stdout) and the documented exit status (an int), never a traceback."""
    from mtb_helpers.runtime.errors import RankError, RankTimeoutError
    try:
        return func()
    except KeyboardInterrupt:
        return interrupted(as_json)
    except ValueError as exc:   # bad input found by a check's validation, before any rank started
        outcome = (exc, "bad arguments: refused before any rank started", 2)
    except RankTimeoutError as exc:
        outcome = (exc, "the ranks stopped answering (a hang); see the message for who waits where",
                   1)
    except RankError as exc:
        outcome = (exc, f"rank {exc.rank} failed; its traceback is in the message", 1)
    exc, diagnosis, status = outcome
    print(f"minitrainbench: error: {exc}", file=sys.stderr, flush=True)
    if as_json and is_primary():
        print_failure_json(exc, diagnosis)
    return status


def interrupted(as_json: bool, diagnosis: str = "interrupted (Ctrl-C): every rank was stopped") -> int:
    """What Ctrl-C ends a command with, wherever it lands: one stderr line, the JSON document
    under ``--json``; returns 130. Imports nothing (it may run in a signal handler)."""
    print("minitrainbench: interrupted", file=sys.stderr, flush=True)
    if as_json and is_primary():
        print_failure_json(KeyboardInterrupt(), diagnosis)
    forget_unhandled_interrupt()
    return 130


def forget_unhandled_interrupt() -> None:
    """Clear CPython's "unhandled KeyboardInterrupt" flag: the interrupt WAS handled.

    CPython sets that flag when code run from a string (``exec``/``eval`` of source text, e.g. the
    methods ``dataclasses`` generates while a module is imported) ends with a KeyboardInterrupt,
    even when a caller catches it later; under ``python -m`` the interpreter then kills itself with
    SIGINT after ``main()`` returned 130 (exit status -2; seen when Ctrl-C landed during an import).
    Every string eval resets the flag when it starts, so one that ends normally clears it."""
    exec("pass", {})  # noqa: S102  (a constant: the reset is the point)


@contextlib.contextmanager
def exit_on_interrupt(as_json: bool) -> Iterator[None]:
    """While the command line loads (every topic and torch: 1-5 s), Ctrl-C ends the process at
    once, the documented way. A KeyboardInterrupt raised there instead can land inside a C
    extension's import (numpy's, under torch's) and be swallowed (the command then runs), turned
    into an ImportError with a traceback, or leave CPython's "unhandled KeyboardInterrupt" flag
    set (exit by SIGINT however main() returns). No rank exists yet, so nothing needs stopping."""
    if threading.current_thread() is not threading.main_thread():   # signal.signal would refuse
        yield
        return

    def exit_now(signum, frame):
        interrupted(as_json, "interrupted (Ctrl-C) while the command loaded: no rank had started")
        os._exit(130)
    previous = signal.signal(signal.SIGINT, exit_now)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)


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
