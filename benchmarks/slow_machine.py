"""Run a command on an emulated slower machine: every CPU keeps only a share of its time for it.

Students' machines (and Binder's) are slower than the one the benchmarks usually run on. To
measure what a student on such a machine waits, this starts one busy loop per CPU at real-time
priority (SCHED_FIFO, so it preempts everything else at once) that takes ``100 - percent`` % of
every period (``--period-ms``, 10 by default) and sleeps the rest, then runs the command:

    python benchmarks/slow_machine.py --percent 68 -- taskset -c 0 python benchmarks/explorer_redraw.py
    python benchmarks/slow_machine.py --percent 68 -- python benchmarks/explorer_redraw.py   # 2 CPUs

Each CPU then runs everything else (the Jupyter kernel, its rank processes) at ``percent`` % of
its speed, on average over a period; pinned with ``taskset`` or spread over every CPU alike. It is
a slower CPU on average, not a slower clock: within a period the work runs at full speed, then
waits, on every CPU at the same time. So choose the percentage by calibrating on a known number
(BENCHMARKS.md: the old code's tp-mlp redraw against issue 24's, pinned and not) rather than from
the arithmetic. Needs the right to use real-time priority (root, or CAP_SYS_NICE); the busy
loops end with the command, whose exit status is this script's. The kernel's real-time throttling
(by default 5 % of every second left to other tasks) never binds: the loops take at most 99 %.
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import time


def next_window(now: float, period: float) -> float:
    """The start of the next busy window at or after ``now`` (``time.monotonic()``, one clock for
    every CPU): a multiple of ``period``, so the loops of all CPUs are busy at the same time."""
    return math.ceil(now / period) * period


def steal(cpu: int, busy: float, period: float, parent: int) -> None:
    """In a child: on ``cpu``, at real-time priority, spin ``busy`` s out of every ``period`` s
    while ``parent`` (the pid read before the fork: it may be gone before the child runs) lives.

    The windows are in phase on every CPU (``next_window``): the whole machine pauses, then runs.
    Out of phase, a message between processes on two CPUs could arrive while its receiver's CPU
    is held and wait out that window, which a really slower machine never makes it do."""
    os.sched_setaffinity(0, {cpu})
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    start = next_window(time.monotonic(), period)
    while os.getppid() == parent:    # never outlives this script, even one killed by SIGKILL
        wait = start - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        while time.monotonic() < start + busy:
            pass
        start = next_window(time.monotonic(), period)   # held up past a window: the next one


def start_loops(percent: float, period: float) -> list[int]:
    """One busy loop per CPU this process may run on; their pids. Raises PermissionError when
    real-time priority is not allowed (checked here first, before any loop starts)."""
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))      # allowed? (undone below)
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    pids, parent = [], os.getpid()
    for cpu in sorted(os.sched_getaffinity(0)):
        pid = os.fork()
        if pid == 0:
            try:
                steal(cpu, period * (100 - percent) / 100, period, parent)
            finally:
                os._exit(1)
        pids.append(pid)
    return pids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--percent", type=float, required=True,
                        help="the share of every CPU the command keeps, in per cent (1-99)")
    parser.add_argument("--period-ms", type=float, default=10.0,
                        help="the period of the busy loops in milliseconds (1-1000, default 10)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    if not (math.isfinite(args.percent) and 1 <= args.percent <= 99):
        parser.error(f"--percent must be between 1 and 99, got {args.percent:g}")
    if not (math.isfinite(args.period_ms) and 1 <= args.period_ms <= 1000):
        parser.error(f"--period-ms must be between 1 and 1000, got {args.period_ms:g}")
    try:
        pids = start_loops(args.percent, args.period_ms / 1000)
    except PermissionError as exc:
        parser.exit(2, f"{parser.prog}: cannot use real-time priority ({exc}); this needs root "
                       f"or CAP_SYS_NICE\n")
    try:
        env = dict(os.environ, MTB_SLOW_MACHINE_LOOPS=" ".join(map(str, pids)))
        return subprocess.run(command, env=env).returncode
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


if __name__ == "__main__":
    sys.exit(main())
