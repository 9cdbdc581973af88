"""Binder's budget and the slider's speed, checked by structure (no timings): ranks share what
the forkserver preloaded, idle pools stop by themselves, release() frees pools, pools beyond the
memory budget are stopped (least recently used first, never one a slider is using), and the
explorer's overview is the notebook's one-Axes figure with the same panels, less their errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import matplotlib
import pytest

matplotlib.use("Agg")

from mtb_helpers import run, shutdown  # noqa: E402
from mtb_helpers.runtime import budget  # noqa: E402
from mtb_helpers.runtime import ranks as ranks_module  # noqa: E402
from mtb_helpers.runtime.start import RANK_LAZY_IMPORTS, preload_modules  # noqa: E402
from tests.procs import forkserver_pid, wait_dead  # noqa: E402


def test_ranks_start_with_torchs_lazy_imports_and_the_course_already_loaded_and_frozen():
    import mtb_helpers.tp.layers  # noqa: F401  (the package loads lazily: the owner imports it)

    shutdown()  # a fresh forkserver, started now with this process's modules

    def what_a_fresh_rank_has():
        import gc
        return ([m for m in RANK_LAZY_IMPORTS if m in sys.modules],
                "mtb_helpers.tp.layers" in sys.modules, gc.get_freeze_count() > 10_000)

    (lazy, layers, frozen), = run(what_a_fresh_rank_has, world_size=1)
    assert lazy == list(RANK_LAZY_IMPORTS)
    assert layers and frozen
    assert "mtb_helpers.runtime.worker" == preload_modules()[0]
    assert not any(".plots" in m or ".widget" in m for m in preload_modules())


def test_a_course_modules_rank_imports_are_preloaded_only_where_it_is_loaded():
    # torch._dynamo (the first torch.optim optimizer imports it) took 0.8 s of a first redraw on
    # one CPU in notebooks whose ranks build no torch.optim optimizer (the course's own strategies
    # and the capstone step the written-out Adam, dp/adam.py; the bug registry imports no PyTorch
    # comparison module); where overlap's ranks step torch.optim, ranks share one import of it
    code = textwrap.dedent("""
        import json, sys
        import mtb_helpers.collectives.ops, mtb_helpers.dp.strategies, mtb_helpers.capstone.check
        from mtb_helpers import BUGS, run, shutdown
        BUGS
        has = lambda: "torch._dynamo" in sys.modules
        ranks = run(has, world_size=2)
        without = [has(), ranks]
        shutdown()
        import mtb_helpers.dp.overlap_check
        from mtb_helpers.runtime.start import rank_imports
        ranks = run(has, world_size=2)   # the forkserver starts: the owner imports it first
        print(json.dumps([without, [has(), ranks, "torch._dynamo" in rank_imports()]]))
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    without, declared = json.loads(out.stdout.strip().splitlines()[-1])
    assert without == [False, [False, False]], "torch._dynamo imported where no rank needs it"
    assert declared == [True, [True, True], True], "overlap's optimizers: torch._dynamo not preloaded"


def test_ranks_and_multiprocessings_helpers_leave_the_owners_process_group():
    # ipykernel's shutdown SIGTERMs every process of its group and waits until none is left; the
    # resource tracker ignores SIGTERM, so the kernel used to wait until jupyter_client's deadline
    from multiprocessing import resource_tracker

    shutdown()
    pids = run(os.getpid, world_size=2)
    helpers = [forkserver_pid(), resource_tracker._resource_tracker._pid]
    assert all(helpers)
    assert all(os.getpgid(p) != os.getpgrp() for p in helpers)
    assert all(os.getpgid(p) != os.getpgrp() for p in pids)


def test_an_idle_pool_is_stopped_and_the_next_call_starts_a_fresh_one(monkeypatch):
    shutdown()
    monkeypatch.setattr(ranks_module, "IDLE_STOP_SECONDS", 0.3)
    pids = run(os.getpid, world_size=2)
    assert wait_dead(pids, within=20), "an idle pool kept its ranks"
    assert 2 not in ranks_module._pools
    new = run(os.getpid, world_size=2)
    assert len(new) == 2 and not set(new) & set(pids)


def test_release_stops_only_the_pools_asked_for():
    two = run(os.getpid, world_size=2)
    three = run(os.getpid, world_size=3)
    ranks_module.release(3)
    assert wait_dead(three)
    assert run(os.getpid, world_size=2) == two


def test_the_memory_reading_counts_this_process_the_forkserver_and_every_rank():
    shutdown()
    alone = budget.tree_mib()
    pids = run(os.getpid, world_size=2)
    under = budget.descendants(os.getpid())
    assert set(pids) <= set(under) and forkserver_pid() in under
    assert budget.tree_mib() > alone + 2 * 5  # each rank has a few MiB of its own, at least


def _budget(monkeypatch, mib: float, grace: float) -> None:
    monkeypatch.setattr(budget, "ENFORCED", True)   # as in a notebook's kernel
    monkeypatch.setattr(budget, "MEMORY_BUDGET_MIB", mib)
    monkeypatch.setattr(budget, "SLIDER_GRACE_SECONDS", grace)


def test_outside_a_kernel_the_memory_budget_stops_no_pool_unless_asked_for(monkeypatch):
    """pytest owns these pools, not a Jupyter kernel: however big the tree, they stay warm."""
    shutdown()
    monkeypatch.setattr(budget, "MEMORY_BUDGET_MIB", 1.0)   # any tree is over it
    assert not budget.applies()
    two = run(os.getpid, world_size=2)
    run(os.getpid, world_size=3)
    assert run(os.getpid, world_size=2) == two


def test_a_pool_starting_over_the_memory_budget_stops_the_least_recently_used_one_first(monkeypatch):
    shutdown()
    _budget(monkeypatch, 1e6, 0.0)           # within budget: every pool stays warm
    two, three = run(os.getpid, world_size=2), run(os.getpid, world_size=3)
    _budget(monkeypatch, 1.0, 0.0)           # now any tree is over it
    four = run(os.getpid, world_size=4)
    assert wait_dead(two + three), "pools over the memory budget kept their ranks"
    assert sorted(ranks_module._pools) == [4]
    assert run(os.getpid, world_size=4) == four   # the pool just started is the one kept


def test_a_slider_moving_between_two_sizes_keeps_both_pools_over_the_budget(monkeypatch):
    # the first move to 3 ranks stops the 4-rank pool (a notebook moving on to another size);
    # going back to 4 within the grace shows a slider: from then on both pools stay warm
    shutdown()
    _budget(monkeypatch, 1.0, 60.0)
    four = run(os.getpid, world_size=4)
    three = run(os.getpid, world_size=3)
    assert wait_dead(four) and sorted(ranks_module._pools) == [3]
    four = run(os.getpid, world_size=4)
    assert sorted(ranks_module._pools) == [3, 4]
    for _ in range(2):
        assert run(os.getpid, world_size=3) == three and run(os.getpid, world_size=4) == four


def test_cells_run_top_to_bottom_are_no_slider_the_pool_used_before_goes(monkeypatch):
    # notebooks 04 and 09 run cells on 2, 4, 2, ... ranks within seconds: in a kernel running
    # cells (not answering a widget) that is no slider, so only the pool in use stays warm
    shutdown()
    _budget(monkeypatch, 1.0, 60.0)
    monkeypatch.setattr(budget, "answering_widget", lambda: False)   # a cell is running
    four = run(os.getpid, world_size=4)
    three = run(os.getpid, world_size=3)
    assert wait_dead(four) and sorted(ranks_module._pools) == [3]
    run(os.getpid, world_size=4)
    assert wait_dead(three), "a cell's pool was kept as if a slider used it"
    assert sorted(ranks_module._pools) == [4]


def test_while_pools_are_warm_the_watch_stops_the_idle_ones_once_over_the_budget(monkeypatch):
    shutdown()
    _budget(monkeypatch, 1e6, 0.0)
    monkeypatch.setattr(budget, "MEMORY_CHECK_SECONDS", 0.1)
    two, three = run(os.getpid, world_size=2), run(os.getpid, world_size=3)
    monkeypatch.setattr(budget, "MEMORY_BUDGET_MIB", 1.0)   # as a kernel that grew past it
    assert run(os.getpid, world_size=3) == three                  # a call: the watch looks again
    assert wait_dead(two, within=30), "the idle pool was kept over the memory budget"
    assert sorted(ranks_module._pools) == [3]    # the one in use stays, alone
    assert run(os.getpid, world_size=3) == three


def test_while_calls_run_the_watch_gives_the_owners_freed_heap_back_where_the_budget_applies(monkeypatch):
    # a check's one-process reference leaves ~17 MiB of freed pages in a kernel's heap (notebook
    # 12); glibc keeps them until told. The watch trims them while calls run, off the call's path
    shutdown()
    run(os.getpid, world_size=2)   # the forkserver's start trims too (fork_helper.py): before it
    trims = []
    monkeypatch.setattr(budget, "MEMORY_CHECK_SECONDS", 0.1)
    monkeypatch.setattr(budget.allocator, "trim", lambda: trims.append(1))
    run(time.sleep, 1.0, world_size=2)
    assert not trims, "the owner's heap trimmed outside a kernel"
    _budget(monkeypatch, 1e6, 0.0)
    run(time.sleep, 1.0, world_size=2)
    deadline = time.monotonic() + 10
    while not trims and time.monotonic() < deadline:   # the watch looks every 0.1 s
        time.sleep(0.05)
    assert trims, "a kernel's freed heap kept through a long call"


def _owner_cycle():
    """In this process: a weak reference to a cycle that is garbage but old (in the oldest
    generation), so only a full collection frees it (as a figure a cell showed and closed)."""
    import gc
    import weakref

    class Node:
        pass

    node = Node()
    node.self = node
    gc.collect()   # it survives (still referenced): now in the oldest generation
    return weakref.ref(node)


@pytest.mark.parametrize("widget", [False, True])
def test_while_a_cell_runs_calls_the_watch_frees_the_owners_cyclic_garbage(monkeypatch, widget):
    # notebook 12: five closed figures (~10 MiB, matplotlib's artists are cycles) waited in the
    # kernel for a rare full collection while its last checks ran. Not while a slider is answered:
    # a redraw is never held up by a collection
    import gc

    shutdown()
    run(os.getpid, world_size=2)
    _budget(monkeypatch, 1e6, 0.0)
    monkeypatch.setattr(budget, "MEMORY_CHECK_SECONDS", 0.1)
    monkeypatch.setattr(budget, "answering_widget", lambda: widget)
    trims = []
    real_trim = budget.allocator.trim
    monkeypatch.setattr(budget.allocator, "trim", lambda: trims.append(1) or real_trim())
    was_enabled = gc.isenabled()
    gc.disable()   # only an explicit collection frees the cycle
    try:
        cycle = _owner_cycle()
        run(time.sleep, 1.0, world_size=2)
        deadline = time.monotonic() + 10
        while not trims and time.monotonic() < deadline:
            time.sleep(0.05)
        assert trims, "the watch did not look while the call ran"
        assert (cycle() is None) is not widget, ("a widget's redraw held up by a collection" if widget
                                                 else "the owner's cyclic garbage kept through calls")
    finally:
        if was_enabled:
            gc.enable()


def _leave_old_cyclic_garbage() -> None:
    """On a rank: a cycle holding 8 MB, old enough that only a full collection frees it."""
    import builtins
    import gc
    import weakref

    import torch

    class Node:
        pass

    node = Node()
    node.self, node.data = node, torch.zeros(1 << 20, dtype=torch.float64)
    gc.collect()   # the cycle survives it (still referenced): now in the oldest generation
    builtins._mtb_cycle = weakref.ref(node)


def _cycle_freed() -> bool:
    import builtins

    return builtins._mtb_cycle() is None


def test_a_ranks_cyclic_garbage_is_freed_after_each_call():
    # FSDP's and autograd's cycles waited on each rank for a rare full collection (notebook 14's
    # ranks grew ~2 MiB per measured FSDP step)
    run(_leave_old_cyclic_garbage, world_size=2)
    assert run(_cycle_freed, world_size=2) == [True, True]


def _dies_within(pids: list[int], seconds: float) -> bool:
    """On a rank: do the processes ``pids`` end (or turn zombie) within ``seconds``?"""
    from tests.procs import wait_dead   # ranks are forks of this process: same sys.path

    return wait_dead(pids, within=seconds)


def test_the_watch_keeps_to_the_budget_during_a_long_call_too(monkeypatch):
    # A 20-step training check is one call of tens of seconds: the idle pool beside it must go
    # while it runs, not after it (notebook 12 peaked in such a cell with both pools warm).
    shutdown()
    _budget(monkeypatch, 1e6, 1.0)
    monkeypatch.setattr(budget, "MEMORY_CHECK_SECONDS", 0.1)
    two, three = run(os.getpid, world_size=2), run(os.getpid, world_size=3)
    monkeypatch.setattr(budget, "MEMORY_BUDGET_MIB", 1.0)
    # the 2-rank pool was used a moment ago: it becomes a candidate 1 s into this call
    assert all(run(_dies_within, two, 20.0, world_size=3, timeout=60.0))
    assert sorted(ranks_module._pools) == [3] and run(os.getpid, world_size=3) == three


def test_the_explorer_overview_is_the_notebooks_figure_without_the_errors():
    import matplotlib.pyplot as plt

    from mtb_helpers.check import check_tp_mlp
    from mtb_helpers.plots.palette import FAIL_COLOR
    from mtb_helpers.tp.plots import plot_steps

    report = check_tp_mlp(world_size=3, bug="row-missing-allreduce")
    panels = plot_steps(report, phase="forward")
    fast = plot_steps(report, phase="forward", errors=False)
    assert len(fast.axes) == len(panels.axes) == 1
    titles = [t.get_text() for t in panels.axes[0].texts if "\nerr " in t.get_text()]
    texts = [t.get_text() for t in fast.axes[0].texts]
    assert titles and all(title.rsplit("\nerr ", 1)[0] in texts for title in titles)  # "rank r: holds"
    assert not any("err " in text for text in texts)
    # the failing panels are the same, framed red; the notebook's says in red how wrong they are
    red_frames = [[p for p in fig.axes[0].patches if not p.get_fill()
                   and matplotlib.colors.same_color(p.get_edgecolor(), FAIL_COLOR)] for fig in (fast, panels)]
    red_titles = [t for t in panels.axes[0].texts if "\nerr " in t.get_text()
                  and matplotlib.colors.same_color(t.get_color(), FAIL_COLOR)]
    assert len(red_frames[0]) == len(red_frames[1]) == len(red_titles) > 0
    assert fast._suptitle.get_text() == panels._suptitle.get_text() and fast.legends
    plt.close("all")


def test_in_a_jupyter_kernel_the_memory_budget_applies_and_tells_a_widget_from_a_cell():
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        reply = kc.execute_interactive("from mtb_helpers.runtime import budget\n"
                                       "assert budget.applies(), 'not seen as a kernel'\n"
                                       "assert not budget.answering_widget(), 'a cell seen as a widget'\n"
                                       "seen = []\n"
                                       "get_ipython().kernel.comm_manager.register_target(\n"
                                       "    'mtb-test', lambda comm, msg: seen.append(budget.answering_widget()))",
                                       timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
        # a widget's message (here a comm opening, as ipywidgets' are): the kernel answers a widget
        kc.shell_channel.send(kc.session.msg("comm_open", {"comm_id": "c1", "target_name": "mtb-test",
                                                           "data": {}}))
        reply = kc.execute_interactive("assert seen == [True], seen", timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
