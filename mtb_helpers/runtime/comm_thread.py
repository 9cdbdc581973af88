"""A rank's communication stream under an emulated link: one thread, one FIFO of operations.

A GPU runs collectives on a communication stream beside the compute stream, in the order they
were issued; ``async_op=True`` returns a handle at once and the computation goes on. Here the
stream is a thread: ``submit(job)`` queues ``job`` (a function), returns a :class:`Handle`, and
the thread runs the jobs one after another. A job blocks in gloo or sleeps (the modelled time), and
both release the GIL, so the rank's own thread computes meanwhile, even on one CPU.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable

__all__ = ["CommStream", "Handle"]

_STOP = object()


class Handle:
    """What an emulated async operation returns (the part of ``torch.distributed.Work`` the
    course and students use): ``wait()``, which re-raises in the caller's thread whatever the job
    raised on the stream, and ``is_completed()``."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._error: BaseException | None = None

    def _finish(self, error: BaseException | None = None) -> None:
        self._error = error
        self._done.set()

    def wait(self, timeout: Any = None) -> bool:
        """Block until the job has run (its modelled time included); True, or its exception."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()


class CommStream:
    """One rank's communication thread; jobs run in submission order (FIFO)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="mtb-comm-stream", daemon=True)
        self.thread.start()

    def submit(self, job: Callable[[], Any]) -> Handle:
        """Queue ``job``; the handle completes when it has returned (or raised)."""
        handle = Handle()
        self._jobs.put((job, handle))
        return handle

    def drain(self) -> None:
        """Wait until every job submitted so far has run (an empty job queued last)."""
        self.submit(lambda: None)._done.wait()

    def close(self) -> None:
        """Let the thread end after the jobs already queued. It is a daemon: a job stuck in a
        collective (a hang the owner reports) does not keep the rank process alive."""
        self._jobs.put((_STOP, None))

    def _loop(self) -> None:
        while True:
            job, handle = self._jobs.get()
            if job is _STOP:
                return
            try:
                job()
                handle._finish()
            except BaseException as exc:  # noqa: BLE001  (raised again in the waiting thread)
                handle._finish(exc)
