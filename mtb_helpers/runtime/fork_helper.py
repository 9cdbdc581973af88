"""multiprocessing's forkserver as a fork of the owner, so that ranks share the owner's torch.

multiprocessing's own forkserver is a new interpreter that imports torch again (~210 MB the
notebook's kernel already holds); forked from the owner, it and its ranks share the owner's pages.

Forking a process that has threads (ipykernel has several) is safe here because the child runs
nothing of the owner's: it keeps only the descriptors multiprocessing passes, resets the signal
handlers, writes to fresh stdio and runs the code the new interpreter would have run; ranks set
one intra-op thread before computing (worker.py), so a fork after the owner used OpenMP cannot
hang. Only from the main thread (another could hold a torch lock the ranks would inherit) and only
on Linux; elsewhere, and with ``MTB_FORK_FORKSERVER=0``, multiprocessing starts a new interpreter.
The resource tracker stays one: it is small, and a fork would keep a copy of every page the owner
changes after it.
"""
from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import traceback
import warnings

from mtb_helpers.runtime import allocator

_owner_prepared = False   # gc.freeze and the allocator settings: once per owner, not per start


def may_fork(args: list[str]) -> bool:
    """Is ``args`` multiprocessing's forkserver command, and may it be a fork of this process?"""
    return (len(args) >= 3 and args[-2] == "-c" and "multiprocessing.forkserver" in args[-1]
            and sys.platform.startswith("linux")
            and threading.current_thread() is threading.main_thread()
            and os.environ.get("MTB_FORK_FORKSERVER", "1") != "0")


def fork_helper(args: list[str], passfds) -> int:
    """Run the helper's ``python -c CODE`` command (see :func:`may_fork`) as a fork of this
    process, in a session of its own; return its pid."""
    global _owner_prepared
    if not _owner_prepared:   # the forkserver restarts after an idle stop: this is done once
        gc.collect()
        gc.freeze()  # the owner's collector no longer writes into pages it shares with the child
        allocator.tune()  # fewer arenas, big blocks returned: fewer pages to duplicate
        _owner_prepared = True
    allocator.trim()
    with warnings.catch_warnings():  # 3.12+ warns of forking with threads: see the docstring
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid:
        return pid
    status = 1
    try:
        _become_helper(set(passfds))
        exec(compile(args[-1], "<multiprocessing helper>", "exec"), {"__name__": "__mp_helper__"})
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 0
    except BaseException:  # noqa: BLE001  (report, then leave: never return into the owner's code)
        traceback.print_exc()
    finally:
        os._exit(status)


def _become_helper(keep: set[int]) -> None:
    """In the child: its own session, only the passed descriptors, default signal handlers, and
    none of the owner's objects ever finalized by the garbage collector."""
    os.setsid()  # out of the kernel's process group: a Jupyter shutdown does not wait for us
    # The owner's garbage not yet collected (a Connection in a reference cycle, say) still names
    # descriptor numbers closed below. The numbers are reused: a rank opens gloo's epoll fd, its
    # wake-up pipe and sockets at the lowest free ones. A collection in a rank (worker.py runs one
    # after every call) then finalized that garbage, closed gloo's descriptor, and gloo's network
    # thread aborted the idle rank ("loop.cc:212] nfds != -1": tests/test_gloo_idle.py). Frozen,
    # the owner's objects are never collected here nor in any rank (their pages stay shared too).
    gc.freeze()
    # The owner's stdio objects (they may hold a thread's lock) are dropped here, before the
    # closing below: if that finalizes one, it closes only the owner's copy of its descriptor.
    sys.stdin = open(os.devnull)
    sys.stdout = open(1, "w", closefd=False, buffering=1)
    sys.stderr = open(2, "w", closefd=False, buffering=1)
    keep = keep | {sys.stdin.fileno()}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
                   signal.SIGALRM, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
