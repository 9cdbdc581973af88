"""What this process and every process it started hold in memory, for the pools' memory budget.

Binder gives JupyterLab and every open kernel 2 GB together, and a notebook's tree (kernel,
forkserver, ranks) is measured against ``MEMORY_BUDGET_MIB`` (issue 24: 560 MiB at peak). Memory
pages are the proportional set size (PSS: a page shared by k processes counts 1/k in each, so the
sum over the tree is what the tree costs, whatever the forks share), except the pages of files
(libtorch's code, mapped by every process using torch): PSS would split those with every other
process on the machine that maps them too, so the tree would look cheaper on a busy machine than
in an idle Binder container. They count whole, once: the most any process of the tree maps. Linux
only (it reads ``/proc``); elsewhere :func:`tree_mib` returns None and only the rank-count budget
applies.

Reading PSS walks every page of every process (~15 ms for a notebook's tree on an idle CPU, up to
~40 ms on a loaded one), so the runtime reads it when a pool is about to start and, while two or
more pools are warm, from its watch thread at most every ``MEMORY_CHECK_SECONDS`` after a call
(ranks.py); never on a call's path.
"""
from __future__ import annotations

import os

MIB = 1024 * 1024


def _rollup_kib(pid: int) -> dict[str, int]:
    """``pid``'s memory totals in KiB ({"Rss": ..., "Pss_Anon": ...}; empty if it has gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return {}
    return {line.split(":")[0]: int(line.split()[1]) for line in lines if line.endswith("kB")}


def _anon_and_file_kib(pid: int) -> tuple[int, int]:
    """(PSS of ``pid``'s anonymous and shared-memory pages, its resident file pages) in KiB."""
    r = _rollup_kib(pid)
    if "Pss_Anon" not in r:   # kernels before 5.x: no split; count PSS as anonymous
        return r.get("Pss", 0), 0
    return r["Pss_Anon"] + r.get("Pss_Shmem", 0), r["Rss"] - r.get("Anonymous", 0)


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
    parts = [_anon_and_file_kib(pid) for pid in [root, *descendants(root)]]
    return (sum(anon for anon, _ in parts) + max(file for _, file in parts)) * 1024 / MIB
