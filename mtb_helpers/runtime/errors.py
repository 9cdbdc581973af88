"""What a student sees when ranks fail: a rank's traceback, or which rank waits where.

Tracebacks come back from ranks as frames; source lines are filled in here, in the owner,
because a notebook cell's code lives in the owner's ``linecache`` and not in the rank's.
"""
from __future__ import annotations

import linecache
import os
import re
import signal
import time
from dataclasses import dataclass

Frame = tuple[str, int, str, "str | None"]  # filename, line number, function, source line

# Frames from these places are machinery; "where is the rank waiting" skips them for the student's.
# An emulated link's stand-ins for torch.distributed's functions (runtime/link_ops.py) count as
# torch's own: the collective is named after them, the student's line is the one calling them.
# (Stack dumps need SIGUSR1, so these are POSIX paths.)
_EMULATION = ("mtb_helpers/runtime/link", "mtb_helpers/runtime/comm_thread")
_MACHINERY = ("/torch/", "mtb_helpers/runtime/worker.py", "/threading.py", "/cloudpickle/", *_EMULATION)


class RankError(RuntimeError):
    """A rank raised. ``.rank`` is the rank blamed (the first to die, else the lowest that raised:
    see ``blame``); the message holds its traceback."""

    def __init__(self, rank: int, message: str, exc_type: str = "", remote_traceback: str = ""):
        super().__init__(message)
        self.rank, self.exc_type, self.remote_traceback = rank, exc_type, remote_traceback
        self.consequences: dict[int, "RankError"] = {}  # other ranks' errors this one caused


class LinkTimeout(RuntimeError):
    """Raised on a rank when the emulated link would end an operation after the call's timeout;
    the owner raises a :class:`RankTimeoutError` naming the link (:func:`link_timeout_message`)."""


YEAR = 365.25 * 24 * 3600   # seconds; a link slower than this per message or byte is refused


def years(seconds: float) -> str:
    """``seconds`` in years, for refusals: '3.2e+292 years'; for inf, that the time overflows."""
    if seconds == float("inf"):
        return f"more than {1.7976931348623157e308 / YEAR:.2g} years (the time overflows a float)"
    return f"{seconds / YEAR:.3g} years"


def too_slow(alpha: float, bandwidth: float, scale: float = 1.0) -> str | None:
    """Why a link of ``alpha`` s per message and ``bandwidth`` B/s, its times stretched by
    ``scale``, would overflow a clock (one message or one byte past a year), or None."""
    for seconds, what, given in ((alpha, "one message", f"alpha={alpha:g} s"),
                                 (1 / bandwidth, "one byte", f"bandwidth={bandwidth:g} B/s")):
        if seconds * scale > YEAR:
            return (f"{given}: this link would take {years(seconds * scale)} to send {what}; "
                    f"α and 1/β{' times the time scale' if scale != 1 else ''} must each be under a year")
    return None


class RankTimeoutError(TimeoutError):
    """Ranks stopped answering. ``.finished`` lists ranks that answered; ``.waiting`` maps each
    rank still busy to where it was (a :class:`WaitPoint`, or None if it could not say)."""

    def __init__(self, message: str, finished: list[int], waiting: dict[int, "WaitPoint | None"]):
        super().__init__(message)
        self.finished, self.waiting = finished, waiting


@dataclass(frozen=True)
class WaitPoint:
    """Where a blocked rank was: the collective (if any) and the student's line."""

    collective: str | None
    filename: str
    lineno: int
    function: str
    source: str

    def __str__(self) -> str:
        inside = f"in {self.collective} " if self.collective else ""
        src = f": {self.source}" if self.source else ""
        return f"{inside}at {_short(self.filename)}:{self.lineno} ({self.function}){src}"


class SourceIndex:
    """Maps frames of shipped code back to the caller's source.

    cloudpickle renames the file of every function it ships by value to ``<dynamic-code>``, so a
    rank cannot say which notebook cell a frame is in. The caller still has the original code
    objects: index them by name and line range, and look the lines up in the caller's linecache.
    """

    def __init__(self, fn: object):
        self._codes: dict[str, list[tuple[int, int, str]]] = {}
        seen: set[int] = set()
        fn = getattr(fn, "__wrapped__", fn)   # run(..., link=...) ships fn inside a LinkedCall
        roots = [fn] + [v for v in getattr(fn, "__globals__", {}).values()
                        if callable(v) and getattr(v, "__module__", None) == "__main__"]
        for root in roots:
            code = getattr(getattr(root, "__func__", root), "__code__", None)
            if code is not None:
                self._add(code, seen)

    def _add(self, code, seen: set[int]) -> None:
        if id(code) in seen:
            return
        seen.add(id(code))
        lines = [line for _, _, line in code.co_lines() if line is not None] or [code.co_firstlineno]
        self._codes.setdefault(code.co_name, []).append(
            (code.co_firstlineno, max(lines), code.co_filename))
        for const in code.co_consts:
            if hasattr(const, "co_code"):
                self._add(const, seen)

    def resolve(self, filename: str, lineno: int, function: str) -> str:
        """The real file name of a frame (unchanged unless it is shipped code)."""
        if filename != "<dynamic-code>":
            return filename
        for first, last, real in self._codes.get(function, []):
            if first <= lineno <= last:
                return real
        return filename


def format_remote_traceback(rank: int, exc_type: str, exc_msg: str, frames: list[Frame],
                            index: SourceIndex | None = None) -> str:
    lines = [f"Traceback from rank {rank} (most recent call last):"]
    for filename, lineno, name, line in frames:
        filename = index.resolve(filename, lineno, name) if index else filename
        source = (line or linecache.getline(filename, lineno)).strip()
        lines.append(f'  File "{_short(filename)}", line {lineno}, in {name}')
        if source:
            lines.append(f"    {source}")
    lines.append(f"{exc_type}: {exc_msg}" if exc_msg else exc_type)
    return "\n".join(lines)


COLLECTIVES = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
    "broadcast", "reduce", "gather", "scatter", "all_to_all", "all_to_all_single", "barrier",
    "monitored_barrier", "send", "recv", "batch_isend_irecv", "all_gather_object",
    "broadcast_object_list", "gather_object", "scatter_object_list"})

_FRAME_RE = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+) in (?P<func>\S+)')


def parse_wait_point(dump: str, index: SourceIndex | None = None) -> WaitPoint | None:
    """Find where a rank waits in a faulthandler dump (``all_threads=True``).

    faulthandler lists each thread's frames innermost first. We take the thread that is running
    the shipped call, name the innermost ``torch.distributed`` function as the collective and
    the innermost non-machinery frame as the student's line.
    """
    for block in re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump):
        frames = [m.groupdict() for m in map(_FRAME_RE.match, block.splitlines()) if m]
        if not any(f["func"] == "_execute" and f["file"].endswith("runtime/worker.py") for f in frames):
            continue
        collective = next((f["func"] for f in frames if f["func"] in COLLECTIVES and (
            "distributed" in f["file"] or any(m in f["file"] for m in _EMULATION))), None)
        user = next((f for f in frames if not any(m in f["file"] for m in _MACHINERY)), None)
        if user is None:
            return WaitPoint(collective, "?", 0, "?", "")
        lineno = int(user["line"])
        filename = index.resolve(user["file"], lineno, user["func"]) if index else user["file"]
        source = linecache.getline(filename, lineno).strip()
        return WaitPoint(collective, filename, lineno, user["func"], source)
    return None


def death_cause(exitcode: int | None) -> str:
    """How a rank process ended, in words: ``exit code 7`` or ``killed by signal SIGKILL ...``."""
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = ", e.g. by the out-of-memory killer" if name == "SIGKILL" else ""
        return f"killed by signal {name}{hint}"
    return f"exit code {exitcode}"


def blame(errors: dict[int, RankError], died_in_order: list[int]) -> RankError:
    """The error to raise when several ranks failed in one call.

    A rank that died takes its peers' collectives down with it: they raise "Connection closed by
    peer" a moment later. The rank that died first is the cause; the others are consequences,
    listed after its message. Without a death, the lowest rank that raised is the cause.
    """
    cause = died_in_order[0] if died_in_order else min(errors)
    primary = errors[cause]
    others = [r for r in sorted(errors) if r != cause]
    if not others:
        return primary
    lines = [str(primary), "",
             "As a consequence, the other ranks failed too:" if died_in_order else "Also:"]
    for rank in others:
        first_line = str(errors[rank]).splitlines()[0] if str(errors[rank]) else ""
        lines.append(f"  {first_line[:300]}")
    error = RankError(cause, "\n".join(lines), primary.exc_type, primary.remote_traceback)
    error.consequences = {r: errors[r] for r in others}
    return error


STACK_DUMP_WAIT = 2.0   # at most, for a blocked rank to write its stack after SIGUSR1 (usually ms)


def ask_where_waiting(pids: dict[int, int], workdir: str,
                      fn: object) -> dict[int, "WaitPoint | None"]:
    """Ask blocked ranks (rank -> pid) for their Python stack (faulthandler on SIGUSR1, written to
    ``rank<r>.stack`` in ``workdir``) and say where each waits."""
    ranks = sorted(pids)
    if not hasattr(signal, "SIGUSR1"):
        return {r: None for r in ranks}
    paths = {r: os.path.join(workdir, f"rank{r}.stack") for r in ranks}
    sizes = {r: _size(p) for r, p in paths.items()}
    for r in ranks:
        try:
            os.kill(pids[r], signal.SIGUSR1)
        except OSError:
            pass
    deadline = time.monotonic() + STACK_DUMP_WAIT
    dumps: dict[int, str] = {}
    while time.monotonic() < deadline and len(dumps) < len(ranks):
        time.sleep(0.05)
        for r in ranks:
            if r not in dumps and _size(paths[r]) > sizes[r]:
                time.sleep(0.05)  # let the dump finish
                with open(paths[r]) as f:
                    f.seek(sizes[r])
                    dumps[r] = f.read()
    index = SourceIndex(fn)
    return {r: parse_wait_point(dumps[r], index) if r in dumps else None for r in ranks}


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def timeout_message(timeout: float, finished: list[int],
                    waiting: dict[int, WaitPoint | None]) -> str:
    lines = [f"ranks stopped answering: no result within timeout={timeout:g} s.",
             f"  finished: {_ranks(finished)}; still waiting: {_ranks(sorted(waiting))}"]
    for rank, point in sorted(waiting.items()):
        lines.append(f"  rank {rank} waits {point}" if point else
                     f"  rank {rank}: could not report where it waits")
    ops = {p.collective for p in waiting.values() if p and p.collective}
    p2p = {"send", "recv", "isend", "irecv"}   # not collectives: one peer, not the whole group
    if ops - p2p:
        lines.append("A collective waits until every rank of the group calls it: look for a rank "
                     "that skipped it, called a different one, or used a different shape.")
    if ops & p2p:
        lines.append("A blocking send waits until its peer posts the matching recv: look for two "
                     "ranks that both send, or both receive, first.")
    lines.append("The rank pool was stopped; the next run() starts a fresh one.")
    return "\n".join(lines)


def link_timeout_message(error: RankError, timeout: float) -> str:
    """What a :class:`LinkTimeout` on a rank (``error``, as the owner got it) tells the student:
    the link, not a rank that skipped a collective, made the call slower than ``timeout``."""
    first = str(error).split("\n", 1)[0]
    what = first.split(f"{error.exc_type}: ", 1)[-1]
    return (f"the emulated link made this call slower than timeout={timeout:g} s: on rank "
            f"{error.rank}, {what}. Not a hang: the link is too slow for this call. Use a faster "
            "link, smaller tensors, a smaller time_scale or a larger timeout.\n"
            "The rank pool was stopped; the next run() starts a fresh one.")


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return "none"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _short(filename: str) -> str:
    # Notebook cells compile to /tmp/ipykernel_<pid>/<hash>.py: call them what they are.
    if "ipykernel_" in filename:
        return "<notebook cell>"
    if filename == "<dynamic-code>":
        return "<shipped function>"
    # Package files by their package path, not this machine's absolute path.
    if "/mtb_helpers/" in filename:
        return "mtb_helpers/" + filename.split("/mtb_helpers/", 1)[1]
    return filename.split("/site-packages/", 1)[-1]
