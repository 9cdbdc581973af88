"""benchmarks/slow_machine.py: bad input stops before any busy loop starts; with real-time
priority allowed, one SCHED_FIFO loop runs on each CPU while the command runs (its exit status
passed on) and none is left afterwards, also when the command fails; without it, a clear error."""
from __future__ import annotations

import json
import os
import sys

import pytest

from tests.procs import alive, wait_dead
from tests.load_scripts import ROOT, load_script

SCRIPT = ROOT / "benchmarks" / "slow_machine.py"


@pytest.fixture
def slow():
    return load_script("benchmarks/slow_machine.py")


@pytest.mark.parametrize("args, said", [
    (["--percent", "0", "--", "true"], "--percent must be between 1 and 99"),
    (["--percent", "nan", "--", "true"], "--percent must be between 1 and 99"),
    (["--percent", "100", "--", "true"], "--percent must be between 1 and 99"),
    (["--percent", "50", "--period-ms", "0.1", "--", "true"], "--period-ms must be between"),
    (["--percent", "50"], "give the command"),
])
def test_bad_input_stops_before_any_loop_starts(slow, monkeypatch, capsys, args, said):
    started = []
    monkeypatch.setattr(slow, "start_loops", lambda *a: started.append(a))
    with pytest.raises(SystemExit) as exc:
        slow.main(args)
    assert exc.value.code == 2 and said in capsys.readouterr().err and started == []


def test_every_cpu_busy_window_starts_on_one_grid(slow):
    """Two loops that start (or fall behind) at different moments still hold their CPUs at the
    same time: a window starts at the next multiple of the period, never before now."""
    period = 0.01
    for now in (12.3456, 12.3401, 12.3499, 0.0, 7.0):
        start = slow.next_window(now, period)
        assert now <= start < now + period + 1e-12
        assert abs(start / period - round(start / period)) < 1e-6       # on the grid
    assert slow.next_window(12.3401, period) == slow.next_window(12.3499, period)


def test_a_loop_per_cpu_at_real_time_priority_while_the_command_runs(slow, tmp_path, capsys):
    seen = tmp_path / "seen.json"
    code = ("import json, os, sys; pids = [int(p) for p in os.environ['MTB_SLOW_MACHINE_LOOPS'].split()]; "
            "json.dump([[os.sched_getscheduler(p), sorted(os.sched_getaffinity(p))] for p in pids] "
            "+ [pids], open(sys.argv[1], 'w')); sys.exit(3)")
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        allowed = True
    except PermissionError:
        allowed = False
    if not allowed:   # e.g. CI without root: it says what it needs and runs nothing
        with pytest.raises(SystemExit) as exc:
            slow.main(["--percent", "68", "--", sys.executable, "-c", code, str(seen)])
        assert exc.value.code == 2 and "needs root or CAP_SYS_NICE" in capsys.readouterr().err
        assert not seen.exists()
        return
    status = slow.main(["--percent", "90", "--", sys.executable, "-c", code, str(seen)])
    *loops, pids = json.loads(seen.read_text())
    assert status == 3                                       # the command's own exit status
    assert loops == [[os.SCHED_FIFO, [cpu]] for cpu in sorted(os.sched_getaffinity(0))]
    assert not any(alive(pid) for pid in pids)               # none outlives the command


def test_the_loops_end_when_the_script_is_killed(tmp_path):
    """A script killed by SIGKILL runs no ``finally``: its loops notice the parent is gone."""
    import signal
    import subprocess

    code = (f"import importlib.util, sys, time; spec = importlib.util.spec_from_file_location('s', {str(SCRIPT)!r}); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "try:\n    pids = m.start_loops(90, 0.01)\nexcept PermissionError:\n    pids = []\n"
            "print(' '.join(map(str, pids)) or 'not allowed', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    said = proc.stdout.readline().split()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if said == ["not allowed", ]:
        assert os.geteuid() != 0   # root may always use real-time priority
        return
    pids = [int(p) for p in said]
    assert len(pids) == len(os.sched_getaffinity(0))
    assert wait_dead(pids, within=10)
