"""The layout explorer and the planner's figures: what they show follows the planner's numbers."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from mtb_helpers.plan import GIB, Layout, memory_per_rank, model  # noqa: E402
from mtb_helpers.plan.plots import plot_stacked_memory, plot_stage_memory  # noqa: E402
from mtb_helpers.plan.widget import explore, layout_explorer  # noqa: E402


def test_explore_shows_the_ranking_and_the_best_layouts_memory():
    items = explore("llama3-8b", 16, 80.0, 64, 0.5, top=4)
    table, times, memory = items
    assert table.startswith("llama3-8b on 16 x H100") and "refused" in table
    assert len(times.axes[0].get_yticklabels()) == 4
    assert times.axes[0].get_xlabel() == "seconds per step (predicted)"
    assert memory.axes[0].get_ylabel() == "GiB per rank" and memory.axes[0].get_title()
    plt.close("all")


def test_explore_with_nothing_that_fits_says_so():
    items = explore("llama3-405b", 8, 80.0, 16, 0.5)
    assert len(items) == 1 and "no layout fits" in items[0]


def test_stacked_bars_add_up_to_the_planners_total():
    stages = memory_per_rank(model("llama3-8b"), Layout(tp=2, pp=4, dp=1, grad_accum=8))
    fig = plot_stage_memory(stages, "tp=2 pp=4", 80 * GIB, 2)
    ax = fig.axes[0]
    tops = {}
    for patch in ax.patches:
        x = round(patch.get_x() + patch.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), patch.get_y() + patch.get_height())
    assert [tops[r] for r in range(4)] == pytest.approx([s.total / GIB for s in stages])
    assert "each of its 2 ranks" in ax.get_xlabel()
    plt.close(fig)
    line = plot_stacked_memory([("a", {"parameters": GIB})], 80 * GIB).axes[0].lines[0]
    assert line.get_ydata()[0] == 80          # the GPU's memory, in GiB
    plt.close("all")


def test_the_explorer_is_built_from_core_widgets():
    import ipywidgets as widgets
    box = layout_explorer("llama3-8b", gpus=16, global_batch=64)
    assert isinstance(box, widgets.VBox)
    plt.close("all")
