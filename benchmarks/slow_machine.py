"""Run a command on an emulated slower machine: every process it starts shares a CPU quota.

Students' machines (and Binder's) are slower than the one the benchmarks usually run on. To
measure what a student on such a machine waits, this puts the command (and every process it
starts: a Jupyter kernel, its rank processes) into a new cgroup whose CPU time is capped at
``--percent`` of one CPU per period (Linux CFS bandwidth control), then runs it:

    python benchmarks/slow_machine.py --percent 68 -- taskset -c 0 python benchmarks/explorer_redraw.py
    python benchmarks/slow_machine.py --percent 100 -- python benchmarks/explorer_redraw.py   # 2 CPUs

``--percent 68`` with ``taskset -c 0`` is one CPU at roughly two thirds of its speed; 100 without
taskset lets two CPUs share one CPU's worth of time. A quota is not a slower clock: a process
that used up its share waits for the next period (``--period-ms``, 10 by default), so choose the
percentage by calibrating on a known number (BENCHMARKS.md: the baseline's tp-mlp redraw against
issue 24's) rather than trusting the arithmetic. Needs write access to the cgroup file system
(root, or a delegated cgroup); v1 (``/sys/fs/cgroup/cpu``) and v2 (``cpu.max``) both work. The
cgroup is removed when the command ends; the command's exit status is this script's.
"""
from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys

V1 = "/sys/fs/cgroup/cpu"
V2 = "/sys/fs/cgroup"


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def make_group(percent: float, period_us: int) -> tuple[str, str]:
    """A new cgroup capped at ``percent`` of one CPU; returns (its directory, its parent's)."""
    quota = max(1000, round(period_us * percent / 100))   # the kernel's minimum quota: 1 ms
    if os.path.isdir(V1) and os.path.exists(os.path.join(V1, "cpu.cfs_quota_us")):
        group = os.path.join(V1, f"mtb_slow_{os.getpid()}")
        os.mkdir(group)
        _write(os.path.join(group, "cpu.cfs_period_us"), str(period_us))
        _write(os.path.join(group, "cpu.cfs_quota_us"), str(quota))
        return group, V1
    with open(os.path.join(V2, "cgroup.controllers")) as f:
        if "cpu" not in f.read().split():
            raise OSError("the cgroup v2 hierarchy has no cpu controller")
    group = os.path.join(V2, f"mtb_slow_{os.getpid()}")
    os.mkdir(group)
    _write(os.path.join(group, "cpu.max"), f"{quota} {period_us}")
    return group, V2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--percent", type=float, required=True,
                        help="CPU time the command may use, in per cent of one CPU (e.g. 68)")
    parser.add_argument("--period-ms", type=float, default=10.0,
                        help="the quota's period in milliseconds (1-1000, default 10)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    if not (math.isfinite(args.percent) and 1 <= args.percent <= 100 * (os.cpu_count() or 1)):
        parser.error(f"--percent must be between 1 and {100 * (os.cpu_count() or 1)} (this "
                     f"machine's CPUs x 100), got {args.percent:g}")
    if not (math.isfinite(args.period_ms) and 1 <= args.period_ms <= 1000):
        parser.error(f"--period-ms must be between 1 and 1000, got {args.period_ms:g}")
    try:
        group, parent = make_group(args.percent, round(args.period_ms * 1000))
    except OSError as exc:
        parser.exit(2, f"{parser.prog}: cannot make a CPU-limited cgroup ({exc}); this needs "
                       f"write access to {V1} (cgroup v1) or {V2} (v2), e.g. as root\n")
    try:
        _write(os.path.join(group, "cgroup.procs"), str(os.getpid()))   # the child inherits it
        return subprocess.run(command).returncode
    finally:
        _write(os.path.join(parent, "cgroup.procs"), str(os.getpid()))
        os.rmdir(group)


if __name__ == "__main__":
    sys.exit(main())
