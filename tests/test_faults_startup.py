"""Issue 25, item 7: Ctrl-C at any moment of a cold ``run()`` (forkserver fork, rank start,
rendezvous, the call) stops the call: nothing printed by ranks, no process or file left behind.
And item 3 at start-up: Ctrl-C while ``minitrainbench`` is still importing torch is one line and
exit 130 too (one JSON document under --json)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
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


# Issue 25, item 3 at start-up: Ctrl-C while the command is still importing torch (1-5 s after
# launch) used to print a traceback from ``import mtb_helpers``. The interrupt is sent a set time
# after the interpreter's own start-up (``site``, before which no Python code of ours can run),
# read from -X importtime's lines on stderr.
LAUNCHERS = {
    "console script": ["-c", "import re, sys\nfrom mtb_helpers.cli import main\nsys.exit(main())"],
    "python -m": ["-m", "mtb_helpers.cli"],
}


def _launch_and_interrupt(tmp_path, launcher, argv, delay):
    mark = uuid.uuid4().hex
    env = {**os.environ, "TMPDIR": str(tmp_path), "MTB_TEST_MARK": mark,
           "PYTHONPROFILEIMPORTTIME": "1"}
    proc = subprocess.Popen([sys.executable, *LAUNCHERS[launcher], *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    err_lines, started = [], threading.Event()

    def read_stderr():
        for line in proc.stderr:
            err_lines.append(line)
            if line.startswith("import time:") and line.rstrip().endswith("| site"):
                started.set()
        started.set()
    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    assert started.wait(60)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out = proc.stdout.read()
    proc.wait(timeout=60)
    reader.join(60)
    err = "".join(line for line in err_lines if not line.startswith("import time:"))
    deadline = time.monotonic() + 10
    while _marked(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    return proc.returncode, out, err, _marked(mark)


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
@pytest.mark.parametrize("delay", [0.05, 0.3, 1.0])
@pytest.mark.parametrize("as_json", [False, True])
def test_ctrl_c_while_the_command_starts_is_one_line_and_130(tmp_path, launcher, delay, as_json):
    argv = ["tp", "check", "--world-size", "2"] + (["--json"] if as_json else [])
    status, out, err, left = _launch_and_interrupt(tmp_path, launcher, argv, delay)
    assert status == 130, (status, out, err)
    assert err == "minitrainbench: interrupted\n", err
    if as_json:
        doc = json.loads(out)     # exactly one document: json.loads refuses anything after it
        assert doc["passed"] is False and doc["error"]["type"] == "KeyboardInterrupt", doc
    else:
        assert out == ""
    assert left == []


def test_an_interrupt_caught_after_a_string_exec_still_exits_130_under_python_m(tmp_path):
    """Ctrl-C that lands inside code run from a string (dataclasses' generated methods, while the
    command imports) leaves CPython's unhandled-KeyboardInterrupt flag set; ``python -m`` then died
    by SIGINT (-2) after main() had printed the document and returned 130."""
    (tmp_path / "interrupted_in_exec.py").write_text(textwrap.dedent("""
        import sys
        import mtb_helpers.cli as cli

        def interrupted_inside_a_string_exec(argv, as_json):
            exec("raise KeyboardInterrupt", {})

        cli._main = interrupted_inside_a_string_exec
        sys.exit(cli.main(["tp", "check", "--json"]))
    """))
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), repo])}
    proc = subprocess.run([sys.executable, "-m", "interrupted_in_exec"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 130, (proc.returncode, proc.stderr)
    assert proc.stderr == "minitrainbench: interrupted\n", proc.stderr
    assert json.loads(proc.stdout)["error"]["type"] == "KeyboardInterrupt"
