"""The data-parallel explorer: a move re-runs the check on the ranks but not the one-process
reference (it depends on neither the world size, the strategy nor the bug), and a run with a bug
leaves that reference as it was."""
from __future__ import annotations

import html

import ipywidgets as widgets
import matplotlib

matplotlib.use("Agg")

from mtb_helpers.dp.check import _problem  # noqa: E402
from mtb_helpers.dp.widget import explore_data_parallel  # noqa: E402


def _shown(explorer) -> str:
    return "\n".join(html.unescape(w.value) for w in explorer.items.children
                     if isinstance(w, widgets.HTML))


def test_moves_reuse_the_reference_and_still_run_the_check():
    _problem.cache_clear()
    explorer = explore_data_parallel(world_size=2, strategy="ddp")
    (size, strategy), (bug, _) = (row.children for row in explorer.children[:2])
    assert "world_size=2, strategy=ddp" in _shown(explorer) and "PASSED" in _shown(explorer)
    size.value = 3
    assert "world_size=3, strategy=ddp" in _shown(explorer) and "PASSED" in _shown(explorer)
    strategy.value = "zero2"
    bug.value = "zero-stale-params"
    assert "bug=zero-stale-params]: FAILED" in _shown(explorer)
    bug.value = "none"
    assert "PASSED" in _shown(explorer)   # the bug's run left the shared reference untouched
    info = _problem.cache_info()
    assert info.misses == 1 and info.hits >= 4
