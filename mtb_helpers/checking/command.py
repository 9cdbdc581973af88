"""Options and output shared by the commands, and how a command ends whatever happens.

Every command is made by :func:`add_command`: its common options (a check's ``--world-size``,
``--dtype``, ``--seed``, ``--bug``: :func:`add_check_options`), its own, then ``--json``; a command
that runs one check is handled by :func:`check_command`. A number option is checked when it is
parsed (:func:`integer`, :func:`real`: argparse names the option and the text typed); a refusal
that needs several options names each as typed (:func:`naming`). A command prints through
:func:`emit_document` (or :func:`emit` for reports) and draws through :func:`save_figure`: rank 0
only under torchrun, the JSON document with ``--json``, else text.

Exit status: 0 every check passed, 1 a check failed (a rank raised or hung included), 2 bad
arguments, 130 interrupted (Ctrl-C). With ``--json`` stdout holds exactly one JSON document in
every one of these cases: ``{"passed": ..., "checks": [...]}`` (``cost``, ``plan``: their own
document), plus ``"error": {"type", "diagnosis", "message"}`` when the command did not get as far
as a report."""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
import threading
from typing import Callable, Iterator


def add_world_size_option(parser: argparse.ArgumentParser, world_size: int = 2) -> None:
    """--world-size: gloo ranks on this machine (``run`` refuses a bad one before any rank
    starts, a check its own minimum); torchrun sets its own."""
    from mtb_helpers.runtime.ranks import MAX_WORLD_SIZE   # torch: not before main() guards Ctrl-C
    parser.add_argument("--world-size", type=int, default=world_size,
                        help=f"number of gloo ranks, 1..{MAX_WORLD_SIZE} (default {world_size}); "
                             "ignored under torchrun, which sets it")


def add_check_options(parser: argparse.ArgumentParser, world_size: int = 2) -> None:
    """--world-size, --dtype, --seed, --bug: the options every check command takes."""
    add_world_size_option(parser, world_size)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bug", default=None,
                        help="inject a deliberate bug (see `python -c 'import mtb_helpers; "
                             "print(mtb_helpers.BUGS)'`); the check must then fail")


def add_command(parent: argparse._SubParsersAction, name: str, help: str, description: str,
                func: Callable[[argparse.Namespace], int], *,
                common: Callable[[argparse.ArgumentParser], None] | None = add_check_options,
                json_help: str = "print the report as JSON",
                **options: tuple | dict) -> argparse.ArgumentParser:
    """``minitrainbench [GROUP] NAME``, handled by ``func(args)`` (it returns the exit status):
    ``common(parser)`` first (the check options; ``None``: none), then one option per keyword
    (``hidden_dim`` is ``--hidden-dim``; :func:`own_options` reads them back), then ``--json``. An
    option is ``(default, help)``, its type that of the default (a list of whole numbers takes
    several, ``False`` makes a flag), or a dict of ``add_argument``'s keywords."""
    parser = parent.add_parser(name, help=help, description=description)
    if common is not None:
        common(parser)
    for key, spec in options.items():
        if isinstance(spec, tuple):
            default, text = spec
            spec = ({"action": "store_true"} if default is False else
                    {"type": int, "nargs": "+", "metavar": "N"} if isinstance(default, list) else
                    {"type": type(default)})
            spec.update(default=default, help=text)
        parser.add_argument("--" + key.replace("_", "-"), **spec)
    parser.add_argument("--json", action="store_true", help=json_help)
    parser.set_defaults(func=func, own=tuple(spec.get("dest", key) if isinstance(spec, dict) else key
                                             for key, spec in options.items()))
    return parser


def check_args(args: argparse.Namespace) -> dict:
    """What every check takes from its command line as typed: world_size, dtype, seed, bug."""
    return {"world_size": args.world_size, "dtype": args.dtype, "seed": args.seed, "bug": args.bug}


def own_options(args: argparse.Namespace, **renamed: str) -> dict:
    """The command's own options (:func:`add_command`'s keywords) by name, or by the name the
    check gives that argument (``renamed``: ``experts="num_experts"``)."""
    return {renamed.get(key, key): getattr(args, key) for key in args.own}


def check_command(check: Callable[..., object], details: Callable[[object], str] | None = None,
                  **renamed: str) -> Callable[[argparse.Namespace], int]:
    """The handler of a command that runs ``check`` once, on :func:`check_args` and
    :func:`own_options`, and prints its report (:func:`emit`, ``details(report)`` below)."""
    def handler(args: argparse.Namespace) -> int:
        report = check(**check_args(args), **own_options(args, **renamed))
        return emit([report], args.json, details)
    return handler


def integer(low: int = 1, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: a whole number in ``[low, high]`` ("1e3" accepted)."""
    def parse(text: str) -> int:
        try:
            value = float(text) if "e" in text.lower() else int(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value != int(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
        if not low <= int(value) <= (high if high is not None else math.inf):
            limit = f"between {low} and {high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"{text} is not {limit}")
        return int(value)
    parse.__name__ = "integer"
    return parse


def real(low: float = 0.0, high: float = math.inf, strict: bool = True) -> Callable[[str], float]:
    """An argparse ``type``: a finite number above ``low`` (``strict``) or at least ``low``, and
    at most ``high``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value < low or (strict and value == low) or value > high:
            side = f"> {low:g}" if strict else f">= {low:g}"
            limit = f"{side} and <= {high:g}" if math.isfinite(high) else side
            raise argparse.ArgumentTypeError(f"{text} is not a finite number {limit}")
        return value
    parse.__name__ = "number"
    return parse


def typed(args: argparse.Namespace, *options: str) -> str:
    """``'--alpha 1e300 --bandwidth 2.5e8'``: those of ``options`` the user typed, as typed
    (the last time each was given); ``''`` when none was."""
    argv = getattr(args, "argv", None) or []
    words = {}
    for i, word in enumerate(argv):
        for option in options:
            if word == option and i + 1 < len(argv):
                words[option] = argv[i + 1]
            elif word.startswith(option + "="):
                words[option] = word.split("=", 1)[1]
    return " ".join(f"{option} {words[option]}" for option in options if option in words)


@contextlib.contextmanager
def naming(args: argparse.Namespace, *options: str) -> Iterator[None]:
    """A ValueError raised inside (bad input found by the library, in its own words) names the
    options the user typed first: ``--alpha 1e300: this link would take ...``."""
    try:
        yield
    except ValueError as exc:
        given = typed(args, *options)
        if not given:
            raise
        raise ValueError(f"{given}: {exc}") from None


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


def failure_document(exc: BaseException | None, diagnosis: str, message: str | None = None) -> dict:
    """The --json document of a command that ended without a report: what happened and why."""
    if message is None:
        message = str(exc) if exc is not None else ""
    return {"passed": False, "checks": [],
            "error": {"type": type(exc).__name__ if exc is not None else None,
                      "diagnosis": diagnosis, "message": message}}


def print_failure_json(exc: BaseException | None, diagnosis: str, message: str | None = None) -> None:
    """:func:`failure_document` on stdout, from rank 0 only under torchrun."""
    if is_primary():
        print_document(failure_document(exc, diagnosis, message))


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
    if as_json:
        print_failure_json(exc, diagnosis)
    return status


def interrupted(as_json: bool, diagnosis: str = "interrupted (Ctrl-C): every rank was stopped") -> int:
    """What Ctrl-C ends a command with, wherever it lands: one stderr line, the JSON document
    under ``--json``; returns 130. Imports nothing (it may run in a signal handler)."""
    print("minitrainbench: interrupted", file=sys.stderr, flush=True)
    if as_json:
        print_failure_json(KeyboardInterrupt(), diagnosis)
    # Clear CPython's "unhandled KeyboardInterrupt" flag: the interrupt WAS handled. CPython sets
    # it when code run from a string (``exec``/``eval`` of source text, e.g. the methods
    # ``dataclasses`` generates while a module is imported) ends with a KeyboardInterrupt, even
    # when a caller catches it later; under ``python -m`` the interpreter then kills itself with
    # SIGINT after ``main()`` returned 130 (exit status -2; seen when Ctrl-C landed during an
    # import). Every string eval resets the flag when it starts, so one that ends normally clears it.
    exec("pass", {})  # noqa: S102  (a constant: the reset is the point)
    return 130


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


def emit_document(document: Callable[[], object], as_json: bool, text: Callable[[], str],
                  status: int = 0) -> int:
    """A command's one output, rank 0 only under torchrun: ``document()`` as one JSON document
    with ``--json``, else ``text()``. Returns ``status`` (the command's exit status)."""
    if is_primary():
        if as_json:
            print_document(document())
        else:
            print(text())
    return status


def emit(reports: list, as_json: bool, details: Callable[[object], str] | None = None,
         footer: str = "") -> int:
    """Print the reports (:func:`emit_document`): one JSON document with ``--json``, else each
    report's table followed by ``details(report)`` when given, then ``footer``. Returns the exit
    status: 0 when every report passed, 1 otherwise."""
    passed = all(r.passed for r in reports)
    return emit_document(
        lambda: {"passed": passed, "checks": [r.to_dict() for r in reports]}, as_json,
        lambda: "\n\n".join([*(str(r) + (f"\n{details(r)}" if details else "") for r in reports),
                              *([footer] if footer else [])]), 0 if passed else 1)


def save_figure(draw: Callable[[], object], path: str | None) -> None:
    """Write ``draw()``'s matplotlib figure to ``path`` (nothing when ``None``), headless (never a
    window from the command line), from rank 0 only under torchrun."""
    if path is None or not is_primary():
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = draw()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
