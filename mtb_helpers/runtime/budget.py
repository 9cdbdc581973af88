"""What this process and every process it started hold in memory, for the pools' memory budget.

Binder gives JupyterLab and every open kernel 2 GB together; a notebook's tree (kernel,
forkserver, ranks) is measured against ``MEMORY_BUDGET_MIB``. Anonymous pages count by their
proportional set size (PSS: a page shared by k processes counts 1/k in each, so the tree's sum is
what it costs); file pages (libtorch's code) count whole, once, since PSS would split them with
other processes on the machine. Linux only (``/proc``); elsewhere only the rank-count budget
applies. A reading walks every page (~15-40 ms): it is taken when a pool is about to start while
another is warm, and from the watch thread (ranks.py) at most every ``MEMORY_CHECK_SECONDS``.
"""
from __future__ import annotations

import gc
import os
import sys
import time

from mtb_helpers.runtime import allocator

MIB = 1024 * 1024
# Above this (issue 24 asks every notebook to peak at 560 MiB at most on Binder), warm pools not
# in use are stopped, least recently used first; a pool about to start counts RANK_MIB a rank. A
# slider moving between two world sizes keeps both warm whatever the budget says (restarting one
# costs 0.1-0.3 s a move): a pool starting again less than SLIDER_GRACE_SECONDS after the budget
# stopped it keeps the pools used in that time, and the watch stops only pools unused that long;
# in a kernel, only while it answers widgets (cells run top to bottom are no slider).
MEMORY_BUDGET_MIB = float(os.environ.get("MTB_MEMORY_BUDGET_MIB", "520"))
RANK_MIB = 35.0               # a rank's own pages once it has run checks (notebook 12: 23-32 MiB)
MEMORY_CHECK_SECONDS = 2.0
SLIDER_GRACE_SECONDS = 5.0    # a student moving a slider moves it again within this
TRIM_SECONDS = 10.0           # the owner's freed heap is given back this long after a call
_stopped_for_memory: dict[int, float] = {}   # world size -> when the budget last stopped its pool
# The budget is for a notebook's tree: it applies in a Jupyter kernel (Binder, Colab, JupyterLab)
# or wherever MTB_MEMORY_BUDGET_MIB is set. A test suite or a script that owns pools is often
# bigger than the budget by itself, and would see its warm pools stopped under it between calls.
ENFORCED = "MTB_MEMORY_BUDGET_MIB" in os.environ


def applies() -> bool:
    """Whether the budget stops pools in this process: set by the environment, or a kernel."""
    if ENFORCED:
        return True
    zmqshell, ipython = sys.modules.get("ipykernel.zmqshell"), sys.modules.get("IPython")
    if zmqshell is None or ipython is None:
        return False
    return isinstance(ipython.get_ipython(), zmqshell.ZMQInteractiveShell)


def answering_widget() -> bool:
    """Whether the kernel's latest request is a widget's (a slider moved: ``comm_msg``) rather
    than a cell being run (``execute_request``). A notebook run top to bottom moves between two
    world sizes within seconds as a slider does (notebooks 04 and 09: 2, 4, 2, ... ranks), and
    then has no reason to keep both pools. Outside a kernel nothing tells them apart: True."""
    ipython = sys.modules.get("IPython")
    kernel = getattr(ipython.get_ipython(), "kernel", None) if ipython is not None else None
    if kernel is None:
        return True
    if hasattr(kernel, "get_parent"):   # ipykernel 6+
        parent = kernel.get_parent("shell")
    else:                               # ipykernel 5 (Colab)
        parent = getattr(kernel, "_parent_header", {})
    return parent.get("header", {}).get("msg_type") != "execute_request"


def _anon_and_file_kib(pid: int) -> tuple[int, int]:
    """(PSS of ``pid``'s anonymous and shared-memory pages, its resident file pages) in KiB;
    (0, 0) if it has gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return 0, 0
    r = {line.split(":")[0]: int(line.split()[1]) for line in lines if line.endswith("kB")}
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


def release_owner_memory() -> None:
    """Give what the owner (a notebook's kernel) no longer uses back to the system: called by the
    idle watch while calls run and for TRIM_SECONDS after. While a cell runs (never during a
    slider's redraw), collect the cyclic garbage first (closed matplotlib figures are cycles:
    notebook 12, ~10 MiB; ~5 ms), then trim glibc's heap (a reference's freed pages; ~1 ms)."""
    if not answering_widget():
        gc.collect()
    allocator.trim()


def forget() -> None:
    """Forget which pools the budget stopped (``shutdown()``: the next pools start afresh)."""
    _stopped_for_memory.clear()


def pool_over_budget(pools: dict, starting: int = 0):
    """The pool to stop for the memory budget, taken out of ``pools`` (world size -> Pool), or
    None. The caller holds the pools' lock and stops the pool it gets.

    Over budget means: the tree's memory, plus RANK_MIB a rank for a pool of ``starting`` ranks
    about to start, is above MEMORY_BUDGET_MIB. The pool taken is the least recently used one
    that is neither in a call nor one a slider is using (nor, when no pool is starting, the one
    used last); while cells run, no pool counts as a slider's (:func:`answering_widget`). The
    tree is read (~15 ms) only when there is such a pool. Nothing is taken where the budget does
    not ``applies()``."""
    if not applies():
        return None
    now = time.monotonic()
    newest = max(pools, key=lambda s: pools[s].last_used, default=None)
    # a widget's call, and (for a pool about to start) one the budget stopped a moment ago
    # starts again: a slider goes back and forth between two world sizes
    sliding = answering_widget() and (
        not starting or now - _stopped_for_memory.get(starting, -1e9) < SLIDER_GRACE_SECONDS)
    idle = [(p.last_used, s) for s, p in pools.items()
            if (s != newest or starting) and not p.lock.locked() and not p.broken
            and (not sliding or now - p.last_used > SLIDER_GRACE_SECONDS)]
    if not idle:
        return None
    used = tree_mib()
    if used is None or used + starting * RANK_MIB <= MEMORY_BUDGET_MIB:
        return None
    size = min(idle)[1]
    _stopped_for_memory[size] = now
    return pools.pop(size)
