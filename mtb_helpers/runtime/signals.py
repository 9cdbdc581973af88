"""The owner's signals: a kill that a second Ctrl-C cannot cut short (:class:`interrupts_deferred`),
and clean-up on SIGTERM (:func:`install_sigterm_cleanup`): a graceful Jupyter shutdown or restart
sends SIGTERM, whose default action ends the process without ``atexit``, so the ranks' work dir
and multiprocessing's ``pymp-*`` dir stayed in $TMPDIR.
"""
from __future__ import annotations

import os
import signal
import threading
from typing import Callable


class interrupts_deferred:  # noqa: N801  (used as a context manager, like a function)
    """Within the block, SIGINT is recorded instead of raising; on leaving, a recorded interrupt
    is raised (unless an exception is already on its way out, e.g. the first interrupt). A student
    who presses stop twice would otherwise interrupt the kill of the ranks half-way, leaving ranks
    that run the student's function."""

    def __enter__(self) -> "interrupts_deferred":
        self._previous = None
        self._got: list[int] = []
        if threading.current_thread() is threading.main_thread():
            try:
                self._previous = signal.signal(signal.SIGINT, lambda s, f: self._got.append(s))
            except ValueError:  # not the main interpreter
                self._previous = None
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            if self._got and exc_type is None:
                if callable(self._previous):
                    self._previous(signal.SIGINT, None)
                elif self._previous != signal.SIG_IGN:
                    raise KeyboardInterrupt
        return False


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
