"""What ranks preload is one policy, runtime/start.py's ``HEAVY_RANK_IMPORTS``: every module it
names exists, no course module declares its own list, and a course module imported after the
ranks started (a notebook cell importing a PyTorch comparison module below the import cell) still
gets its heavy imports preloaded: the next
``run`` restarts the pools from a forkserver that imported them, so the ranks share one copy
instead of each importing it (torch._dynamo: ~0.8 s and ~35 MB a rank). Not while a call is in
flight: then the pools stay, and the next run asks again."""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import textwrap
import threading

from pathlib import Path

from mtb_helpers.runtime import ranks as ranks_module
from mtb_helpers.runtime import start
from mtb_helpers.runtime.ranks import run, shutdown


def test_a_module_imported_after_the_ranks_started_has_its_imports_preloaded():
    code = textwrap.dedent("""
        import json, os, sys
        from multiprocessing import forkserver
        from mtb_helpers import run, warm_up
        has = lambda: ("torch._dynamo" in sys.modules, os.getpid())
        warm_up(2, background=False)
        before = run(has, world_size=2)
        server = forkserver._forkserver._forkserver_pid
        import mtb_helpers.dp.overlap_check      # HEAVY_RANK_IMPORTS: torch._dynamo
        after = run(has, world_size=2)
        again = run(has, world_size=2)
        print(json.dumps([before, after, again, server != forkserver._forkserver._forkserver_pid]))
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    before, after, again, new_server = json.loads(out.stdout.strip().splitlines()[-1])
    assert [has for has, _ in before] == [False, False]
    assert [has for has, _ in after] == [True, True], "the late module's imports were not preloaded"
    assert new_server and not {p for _, p in before} & {p for _, p in after}   # fresh ranks, once
    assert [p for _, p in again] == [p for _, p in after]                       # then kept


PACKAGE = Path(__file__).resolve().parents[1] / "mtb_helpers"


def test_every_module_the_policy_names_exists_and_none_declares_its_own():
    missing = [m for m in start.HEAVY_RANK_IMPORTS if importlib.util.find_spec(m) is None]
    assert not missing, f"runtime/start.py's HEAVY_RANK_IMPORTS names modules that are gone: {missing}"
    declaring = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if re.search(r"^RANK_IMPORTS\s*=", p.read_text(), re.M)]
    assert not declaring, f"{declaring} declare RANK_IMPORTS: the policy is start.py's, in one place"


def test_the_policy_follows_what_the_owner_loaded(monkeypatch):
    monkeypatch.setattr(start, "HEAVY_RANK_IMPORTS", {"mtb_helpers.not_loaded": ("x.heavy",),
                                                      "mtb_helpers.runtime.start": ("y.heavy",)})
    assert start.rank_imports() == [*start.RANK_LAZY_IMPORTS, "y.heavy"]


def test_missing_imports_are_found_only_for_what_the_forkserver_lacked(monkeypatch):
    monkeypatch.setattr(start, "_preloaded", frozenset(start.rank_imports()))
    assert start.preload_missing() == []
    monkeypatch.setattr(start, "_preloaded", frozenset())
    assert start.preload_missing() == start.rank_imports()   # every declared name is missing
    monkeypatch.setattr(start, "_preloaded", None)          # no forkserver started here
    assert start.preload_missing() == []


def test_no_restart_while_a_call_is_in_flight():
    shutdown()
    pids = run(lambda: __import__("os").getpid(), world_size=2)
    pool = ranks_module._pools[2]
    held, go = threading.Event(), threading.Event()

    def hold() -> None:
        with pool.lock:   # what a call in another thread (a widget's) holds
            held.set()
            go.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(30)
    try:
        ranks_module._restart_for_preload()
        assert ranks_module._pools.get(2) is pool and not pool.broken
    finally:
        go.set()
        thread.join()
    assert run(lambda: __import__("os").getpid(), world_size=2) == pids   # the same ranks
    ranks_module._restart_for_preload()                                   # idle now: stopped
    assert 2 not in ranks_module._pools
