"""The owner's signals: a kill that a second Ctrl-C cannot cut short (:func:`interrupts_deferred`),
and clean-up on SIGTERM (:func:`install_sigterm_cleanup`): a graceful Jupyter shutdown or restart
sends SIGTERM, whose default action ends the process without ``atexit``, so the ranks' work dir
and multiprocessing's ``pymp-*`` dir stayed in $TMPDIR.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Callable, Iterator


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Within the block, SIGINT is recorded instead of raising; on leaving, a recorded interrupt
    is raised (unless an exception is already on its way out, e.g. the first interrupt). A student
    who presses stop twice would otherwise interrupt the kill of the ranks half-way, leaving ranks
    that run the student's function."""
    got: list[int] = []
    previous = None
    if threading.current_thread() is threading.main_thread():
        try:
            previous = signal.signal(signal.SIGINT, lambda s, f: got.append(s))
        except ValueError:  # not the main interpreter
            previous = None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    if got and previous is not None:   # reached only when the block raised nothing
        if callable(previous):
            previous(signal.SIGINT, None)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt


_installed = False


def install_sigterm_cleanup(cleanup: Callable[[], None]) -> None:
    """Run ``cleanup`` when this process gets SIGTERM, then die of SIGTERM as before.

    Only from the main thread (Python's rule for handlers) and only while SIGTERM has its default
    action: a program that handles SIGTERM itself keeps its own handler.
    """
    global _installed
    if _installed or not hasattr(signal, "SIGTERM"):
        return
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return

    def on_sigterm(signum, frame) -> None:
        try:
            cleanup()
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:
        return
    _installed = True
