"""The private parts of ``multiprocessing`` the runtime leans on, in one place, checked once.

CPython does not promise these names. They exist, with the signatures used here, in the versions
CI tests (``TESTED``); tests/test_mp_private.py runs on each. When one is missing (a newer Python
changed it), the runtime falls back to multiprocessing's public behaviour and says so once, with a
warning naming what the fallback costs (``COSTS``: what each name is for, in the student's terms).
"""
from __future__ import annotations

import contextlib
import sys
import warnings
from multiprocessing import forkserver as mp_forkserver
from multiprocessing import spawn as mp_spawn
from multiprocessing import util as mp_util
from typing import Callable, Iterator

TESTED = ((3, 11), (3, 12), (3, 13))
COSTS = {
    "spawn.get_preparation_data": "every rank re-imports the owner's __main__ (an unguarded script "
                                  "runs again in every rank)",
    "util.spawnv_passfds": "the forkserver is a new interpreter: torch imported again (~200 MB "
                           "more per notebook) and a Jupyter shutdown waits ~2 s for it",
    "forkserver._forkserver._stop": "the idle forkserver is not stopped: its memory is held until "
                                    "this process exits",
    "util._run_finalizers": "after a kill, multiprocessing's pymp-* temporary dir may be left "
                            "behind",
}
_MODULES = {"spawn": mp_spawn, "util": mp_util, "forkserver": mp_forkserver}
_warned: set[str] = set()


def _lookup(name: str):
    """The object ``name`` ("util.spawnv_passfds") names, or None."""
    obj = _MODULES[name.split(".")[0]]
    for part in name.split(".")[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def available(name: str) -> bool:
    """Is the private ``name`` there? If not, warn once (naming the cost of the fallback)."""
    if _lookup(name) is not None:
        return True
    if name not in _warned:
        _warned.add(name)
        warnings.warn(f"multiprocessing.{name} is missing on Python {sys.version.split()[0]} "
                      f"(tested: {', '.join('%d.%d' % v for v in TESTED)}): falling back to "
                      f"multiprocessing's public behaviour, so {COSTS[name]}", RuntimeWarning,
                      stacklevel=3)
    return False


@contextlib.contextmanager
def patched_start(spawnv_passfds: Callable) -> Iterator[None]:
    """While processes start: no ``__main__`` re-import, and ``spawnv_passfds`` starts the helper
    processes (the forkserver, the resource tracker). Each part that is missing is left out."""
    saved = []   # (module, name, what it held), put back afterwards
    if available("spawn.get_preparation_data"):
        original = mp_spawn.get_preparation_data

        def without_main(name):
            data = original(name)
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
            return data

        saved.append((mp_spawn, "get_preparation_data", original))
        mp_spawn.get_preparation_data = without_main
    if available("util.spawnv_passfds"):
        saved.append((mp_util, "spawnv_passfds", mp_util.spawnv_passfds))
        mp_util.spawnv_passfds = spawnv_passfds
    try:
        yield
    finally:
        for module, name, was in saved:
            setattr(module, name, was)


def stop_forkserver() -> None:
    """Stop multiprocessing's forkserver if one runs (it starts again when next needed)."""
    if getattr(mp_forkserver, "_forkserver", None) is None or not available("forkserver._forkserver._stop"):
        return
    try:
        mp_forkserver._forkserver._stop()
    except (OSError, ValueError):
        pass


def run_exit_finalizers() -> None:
    """Run multiprocessing's exit finalizers now (a signal death never reaches them)."""
    if not available("util._run_finalizers"):
        return
    try:
        mp_util._run_finalizers(0)
        mp_util._run_finalizers()
    except Exception:  # noqa: BLE001  (clean-up on the way out must not raise)
        pass
