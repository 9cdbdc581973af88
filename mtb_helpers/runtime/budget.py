"""What this process and every process it started hold in memory, for the pools' memory budget.

Binder gives JupyterLab and every open kernel 2 GB together, and a notebook's tree (kernel,
forkserver, ranks) is measured against ``MEMORY_BUDGET_MIB`` (issue 24: 560 MiB at peak). The
measure is the proportional set size (PSS): a page shared by k processes counts 1/k in each, so
the sum over the tree is what the tree really costs, whatever the forks share. Linux only (it reads
``/proc``); elsewhere :func:`tree_mib` returns None and only the rank-count budget applies.

Reading PSS walks every page of every process (~15 ms for a notebook's tree on an idle CPU, up to
~40 ms on a loaded one), so the runtime reads it when a pool is about to start and, while two or
more pools are warm, from its watch thread at most every ``MEMORY_CHECK_SECONDS`` after a call
(ranks.py); never on a call's path.
"""
from __future__ import annotations

import os

MIB = 1024 * 1024


def _pss_kib(pid: int) -> int:
    """``pid``'s PSS in KiB (0 if it has gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            data = f.read()
    except OSError:
        return 0
    start = data.find(b"\nPss:")
    return int(data[start + 5:data.index(b"kB", start)]) if start >= 0 else 0


def descendants(root: int) -> list[int]:
    """Every live process under ``root`` (children, their children, ...), from ``/proc``."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])  # the name may hold spaces
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out


def tree_mib(root: int | None = None) -> float | None:
    """PSS of ``root`` (default: this process) and all its descendants, in MiB; None without
    ``/proc/<pid>/smaps_rollup`` (not Linux, or a kernel older than 4.14)."""
    root = os.getpid() if root is None else root
    if not os.path.exists(f"/proc/{root}/smaps_rollup"):
        return None
    return sum(_pss_kib(pid) for pid in [root, *descendants(root)]) * 1024 / MIB
