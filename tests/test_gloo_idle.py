"""An idle rank must not lose gloo's descriptors to the owner's garbage.

The forkserver is a fork of the owner (runtime/fork_helper.py) and closes every descriptor the
owner had. The owner's Python objects come along, though, garbage included: a Connection in a
reference cycle the owner had not collected yet still names its old descriptor number. Ranks
open their own descriptors at the lowest free numbers (gloo's epoll fd, its wake-up pipe,
sockets); a rank's collection after a call then finalized that Connection, which closed the
rank's descriptor at that number, and gloo's network thread aborted the idle rank
(``loop.cc:212] nfds != -1``, or ``loop.cc:91] read: Bad file descriptor``): the next call
found "rank 0 died (killed by signal SIGABRT)".

The owner here is a fresh interpreter, so that its descriptor numbers are the small ones ranks
reuse. It has imported ``forkserver_setup`` (as the test suite's ``no_ranks`` fixture does, by
importing every module), so that module's collection does not run in the forkserver.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

OWNER = textwrap.dedent("""
    import gc, os
    from multiprocessing.connection import Pipe
    import mtb_helpers.runtime.forkserver_setup  # noqa: F401  (does nothing in the owner)
    from mtb_helpers import run, shutdown

    def gloo_descriptors():
        found = []
        for fd in os.listdir("/proc/self/fd"):
            try:   # the listing's own descriptor is gone by now
                link = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if "eventpoll" in link or "pipe:" in link:
                found.append(int(fd))
        return sorted(found)

    run(os.getpid, world_size=2)   # the first forkserver: the owner collects and freezes before it
    shutdown()                     # the next run forks a new forkserver from the owner as it is now
    gc.disable()                   # keep the garbage uncollected until the fork, as it may well be

    class Cycle:
        pass

    garbage = Cycle()
    garbage.me = garbage
    garbage.conns = [Pipe(duplex=False) for _ in range(24)]
    stale = {c.fileno() for pair in garbage.conns for c in pair}
    del garbage
    used = run(gloo_descriptors, world_size=2)
    print("overlap", sorted(stale & set(used[0])))   # rank descriptors the garbage names
    gc.enable()
    pids = [run(os.getpid, world_size=2) for _ in range(4)]   # each call ends in a collection
    print("pids", len({tuple(p) for p in pids}))
    shutdown()
""")


def test_the_owners_garbage_closes_no_descriptor_of_an_idle_rank():
    proc = subprocess.run([sys.executable, "-c", OWNER], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    # the garbage names descriptors the ranks use, or this test could not fail
    assert lines["overlap"] != "[]", proc.stdout
    # the same two rank processes answered every call: none died between calls
    assert lines["pids"] == "1", proc.stdout + proc.stderr
    assert "SIGABRT" not in proc.stdout + proc.stderr
    assert "Bad file descriptor" not in proc.stdout + proc.stderr   # no stale close anywhere
