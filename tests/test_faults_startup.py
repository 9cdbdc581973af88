"""Issue 25, item 7: Ctrl-C at any moment of a cold ``run()`` (forkserver fork, rank start,
rendezvous, the call) stops the call: nothing printed by ranks, no process or file left behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import psutil
import pytest

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from multiprocessing import forkserver
    from mtb_helpers import run
    from mtb_helpers.runtime.pool import Pool

    def interrupt_me(*args):
        os.kill(os.getpid(), signal.SIGINT)

    phase = os.environ.get("PHASE")
    if phase == "fork":            # inside the forkserver's fork, in the owner's at-fork hooks
        os.register_at_fork(after_in_parent=interrupt_me)
    elif phase == "rank-launch":   # a rank forked by the forkserver, its pid not yet read back
        connect = forkserver.connect_to_new_process
        def connect_then_interrupt(fds):
            out = connect(fds)
            interrupt_me()
            return out
        forkserver.connect_to_new_process = connect_then_interrupt
    elif phase == "rendezvous":    # ranks started, joining their process group
        ready = Pool.wait_ready
        def interrupt_then_wait(self):
            interrupt_me()
            return ready(self)
        Pool.wait_ready = interrupt_then_wait

    def slow():
        time.sleep(3)
        return 1

    print("go", flush=True)
    try:
        run(slow, world_size=2, timeout=30)
        print("completed", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
""")


def _marked(mark: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("MTB_TEST_MARK") == mark and \
                    proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return found


@pytest.mark.parametrize("phase, delay", [("fork", None), ("rank-launch", None),
                                          ("rendezvous", None), (None, 0.0), (None, 0.02),
                                          (None, 0.1)])
def test_ctrl_c_during_a_cold_start_stops_the_call_and_leaves_nothing(tmp_path, phase, delay):
    mark = uuid.uuid4().hex
    env = {**os.environ, "TMPDIR": str(tmp_path), "MTB_TEST_MARK": mark, "PHASE": phase or ""}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline() == "go\n"
    if delay is not None:
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (130, "interrupted\n"), (out, err)
    assert "[rank" not in err and "Traceback" not in err and "Exception ignored" not in err, err
    deadline = time.monotonic() + 10
    while _marked(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _marked(mark)
    ours = [p.name for p in tmp_path.iterdir() if p.name.startswith(("mtb-", "pymp-"))]
    assert ours == []     # (torch may leave its own torchinductor_* cache there)
