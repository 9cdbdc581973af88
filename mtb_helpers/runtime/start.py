"""How rank processes start: a forkserver that has already imported what ranks need.

Every page a rank shares with the forkserver costs Binder's memory once instead of once per rank.
On Linux the forkserver is a fork of the owner (fork_helper.py): kernel, forkserver and ranks share
one torch. Elsewhere it is a new interpreter that preloads torch, what ranks import lazily
(:func:`rank_imports`) and the course modules ranks unpickle functions from, then freezes its
garbage collector (forkserver_setup.py).
"""
from __future__ import annotations

import contextlib
import importlib
import multiprocessing as mp
import os
import subprocess
import sys
import threading

from mtb_helpers.runtime.fork_helper import fork_helper, may_fork
from mtb_helpers.runtime.mp_private import patched_start
from mtb_helpers.runtime.signals import interrupts_deferred

_start_lock = threading.Lock()

# The one policy for what ranks find imported before they start (docs/design.md, "What ranks find
# imported is one policy"): a preload shares its pages with every rank, but one no rank of this
# notebook needs delays its first ranks and holds memory for nothing. RANK_LAZY_IMPORTS: what torch
# imports lazily in a rank during every topic's checks (sympy: ~45 MB a rank), always preloaded.
# HEAVY_RANK_IMPORTS: what the rank code of some course modules imports lazily (torch._dynamo, ~0.8 s
# and ~35 MB a rank, for CommDebugMode and a torch.optim step), preloaded only once the owner has
# loaded that module; tests/test_rank_imports.py and tests/test_runtime_memory_and_drawing.py hold
# both sides. A module loaded after the forkserver started is found by ``preload_missing``, and
# the next ``run`` restarts the pools from a forkserver that preloads its imports (ranks.py).
RANK_LAZY_IMPORTS = ("torch.fx.experimental.symbolic_shapes", "torch.utils.serialization")
_DTENSOR_DEBUG = ("torch.distributed.tensor.debug",)
_TORCH_OPTIM = ("torch._dynamo",)
HEAVY_RANK_IMPORTS: dict[str, tuple[str, ...]] = {   # course module -> what its rank code imports
    "mtb_helpers.tp.pytorch": _DTENSOR_DEBUG,
    "mtb_helpers.sp.pytorch": _DTENSOR_DEBUG,
    "mtb_helpers.grid.pytorch": _DTENSOR_DEBUG,
    "mtb_helpers.dp.pytorch": _DTENSOR_DEBUG,
    "mtb_helpers.pp.pytorch": ("torch.distributed.pipelining",),
    "mtb_helpers.dp.overlap_pytorch": _TORCH_OPTIM,
    "mtb_helpers.dp.overlap_check": _TORCH_OPTIM,
    "mtb_helpers.dp.overlap_time": _TORCH_OPTIM,
    "mtb_helpers.dp.overlap_precision": _TORCH_OPTIM,
}
TRACKER_FLAGS = ("-S", "-I")   # see _spawn_in_own_session
# Owner-side modules the ranks never need: drawing, widgets, the command line.
_NOT_FOR_RANKS = (".plots", ".widget", ".widgets", ".cli", ".explorer")


def start_method() -> str:
    """forkserver (torch preloaded) where the platform has it; spawn otherwise. Ranks are never
    forked straight from the owner (unsafe once it has used OpenMP threads, and on macOS); the
    forkserver itself is a fork of the owner on Linux (fork_helper.py)."""
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


@contextlib.contextmanager
def without_main_reimport():
    """Start processes without re-running the owner's ``__main__`` in them.

    multiprocessing normally re-imports the main script in every child so that functions defined
    there can be found by name; that re-runs a student's unguarded script top to bottom in every
    rank. We ship functions by value (cloudpickle), so ranks never need ``__main__``: drop it
    from the preparation data while our ranks start.
    """
    with _start_lock, patched_start(_spawn_in_own_session):   # mp_private.py: private names
        os.environ["MTB_FORKSERVER_SETUP"] = "1"  # read by a forkserver that starts now
        try:
            yield
        finally:
            os.environ.pop("MTB_FORKSERVER_SETUP", None)


def _spawn_in_own_session(path, args, passfds) -> int:
    """multiprocessing's helper processes (the forkserver, the resource tracker), started in a
    session of their own; the forkserver as a fork of the owner where that is safe
    (fork_helper.py), with torch's lazy imports loaded first so that owner and ranks share them.
    Out of the kernel's process group: ipykernel's shutdown signals every process of its group and
    waits for none to be left, and the resource tracker ignores SIGTERM (2.6 s instead of 0.7 s).
    Both still exit when the owner's end of their pipe closes."""
    global _preloaded
    if args and "multiprocessing.forkserver" in args[-1]:
        _preloaded = frozenset(rank_imports())   # what this forkserver's ranks will find imported
    if may_fork(args):
        for name in rank_imports():  # imported once, shared by the owner and every rank
            importlib.import_module(name)
        return fork_helper(args, passfds)
    if args and "multiprocessing.resource_tracker" in args[-1]:
        # the tracker runs the standard library only: without site (.pth files, site-packages)
        # and isolated, ~2.5 MiB less of a notebook's memory (issue 24)
        args = [args[0], *TRACKER_FLAGS, *args[1:]]
    proc = subprocess.Popen(args, executable=path, pass_fds=tuple(passfds), close_fds=True,
                            start_new_session=True)
    proc.returncode = 0  # multiprocessing waits for this pid itself; subprocess must not reap it
    return proc.pid


def _course_modules() -> list[str]:
    return sorted(name for name in list(sys.modules) if name.startswith("mtb_helpers.")
                  and not any(part in name for part in _NOT_FOR_RANKS))


def rank_imports() -> list[str]:
    """What ranks will import lazily: RANK_LAZY_IMPORTS, and the HEAVY_RANK_IMPORTS of the course
    modules loaded in this process."""
    heavy = (name for module, names in HEAVY_RANK_IMPORTS.items() if module in sys.modules
             for name in names)
    return list(dict.fromkeys([*RANK_LAZY_IMPORTS, *heavy]))


_preloaded: frozenset[str] | None = None   # rank_imports() when the last forkserver started


def preload_missing() -> list[str]:
    """What HEAVY_RANK_IMPORTS of course modules loaded since the forkserver started it did not
    preload (a notebook cell importing a PyTorch comparison module after its import cell started
    the ranks); [] when none, or no forkserver was started here. Every ``run`` asks (~4 µs)."""
    if _preloaded is None:
        return []
    return [n for n in rank_imports() if n not in _preloaded]


def preload_modules() -> list[str]:
    """What the forkserver imports before forking ranks (only read when it starts)."""
    return ["mtb_helpers.runtime.worker", *rank_imports(), *_course_modules(),
            "mtb_helpers.runtime.forkserver_setup"]


def start_forkserver() -> None:
    """Start the forkserver now, from this thread (warm_up calls it from the notebook's main
    thread, the only one it may be forked from, before it starts pools in the background)."""
    if start_method() == "forkserver":
        from multiprocessing import forkserver

        context()
        with interrupts_deferred(), without_main_reimport():   # Ctrl-C: after the fork (pool.py)
            forkserver.ensure_running()


def context() -> mp.context.BaseContext:
    ctx = mp.get_context(start_method())
    if start_method() == "forkserver":
        ctx.set_forkserver_preload(preload_modules())
    return ctx
