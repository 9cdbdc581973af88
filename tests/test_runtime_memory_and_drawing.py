"""Binder's budget and the slider's speed, checked by structure (no timings): ranks share what
the forkserver preloaded, idle pools stop by themselves, release() frees pools, and the explorer's
overview is drawn on one Axes with the same panels as the per-panel figure."""
from __future__ import annotations

import os
import sys
import matplotlib

matplotlib.use("Agg")

from mtb_helpers import run, shutdown  # noqa: E402
from mtb_helpers.runtime import ranks as ranks_module  # noqa: E402
from mtb_helpers.runtime.start import RANK_LAZY_IMPORTS, preload_modules  # noqa: E402
from tests.procs import forkserver_pid, wait_dead  # noqa: E402


def test_ranks_start_with_torchs_lazy_imports_and_the_course_already_loaded_and_frozen():
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


def test_the_explorer_overview_is_one_axes_with_every_panel_of_the_per_panel_figure():
    import matplotlib.pyplot as plt

    from mtb_helpers.check import check_tp_mlp
    from mtb_helpers.plots.palette import FAIL_COLOR
    from mtb_helpers.tp.plots import plot_steps

    report = check_tp_mlp(world_size=3, bug="row-missing-allreduce")
    panels = plot_steps(report, phase="forward")
    fast = plot_steps(report, phase="forward", one_axes=True)
    assert len(fast.axes) == 1 and len(panels.axes) > 1
    titles = [ax.get_title().rsplit("\nerr ", 1)[0] for ax in panels.axes]
    texts = [t.get_text() for t in fast.axes[0].texts]
    assert all(title in texts for title in titles)  # the same "rank r: holds" per panel
    # the failing panels are the same, framed red (their errors are in the table beside it)
    red_frames = [p for p in fast.axes[0].patches if not p.get_fill()
                  and matplotlib.colors.same_color(p.get_edgecolor(), FAIL_COLOR)]
    red_panels = [ax for ax in panels.axes
                  if matplotlib.colors.same_color(ax.title.get_color(), FAIL_COLOR)]
    assert len(red_frames) == len(red_panels) > 0
    assert fast._suptitle.get_text() == panels._suptitle.get_text() and fast.legends
    plt.close("all")
