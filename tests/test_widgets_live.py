"""The explorers' shared frame: items updated in place on every control change, a failing render
shown as one line, and the two-layer figure drawing the same picture as the ordinary one."""
from __future__ import annotations

import ipywidgets as widgets
import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from PIL import Image  # noqa: E402

from mtb_helpers.plots import live  # noqa: E402
from mtb_helpers.plots.live import LiveFigure, Png  # noqa: E402
from mtb_helpers.widgets.frame import live_view  # noqa: E402


def _pixels(png: bytes) -> np.ndarray:
    import io
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)


def _bar_figure(calls: dict) -> LiveFigure:
    """A bar per value on fixed axes; the key is the number of bars."""

    def build(new_figure, values):
        calls["build"] += 1
        fig = new_figure((3, 2))
        ax = fig.add_axes((0.15, 0.15, 0.8, 0.7), xlim=(0, len(values)), ylim=(0, 10))
        ax.set_xticks(range(len(values)), [f"bar {i}" for i in range(len(values))])
        return ax

    def update(fig, ax, values):
        ax.set_title(f"sum {sum(values)}")
        return [ax.add_patch(Rectangle((i + 0.1, 0), 0.8, v, color="C0"))
                for i, v in enumerate(values)] + [ax.title]

    return LiveFigure(len, build, update)


def test_a_control_change_updates_the_same_widgets_and_a_failure_is_one_line():
    size = widgets.IntSlider(value=2, min=1, max=4)
    calls = {"build": 0}
    bars = _bar_figure(calls)

    def render() -> list:
        if size.value == 3:
            raise ValueError("3 does not divide 8")
        return [f"ran with {size.value}", bars.png([1] * size.value)]

    view = live_view([[size]], render)
    assert view.children[0].children == (size,)
    text, image = view.children[-1].children
    assert isinstance(text, widgets.HTML) and "ran with 2" in text.value
    assert isinstance(image, widgets.Image) and bytes(image.value).startswith(b"\x89PNG")
    first = bytes(image.value)
    size.value = 4
    assert view.children[-1].children == (text, image)   # updated in place, not made again
    assert "ran with 4" in text.value and bytes(image.value) != first
    size.value = 3
    [error] = view.children[-1].children
    assert "ValueError: 3 does not divide 8" in error.value
    size.value = 2
    assert "ran with 2" in view.children[-1].children[0].value
    assert bytes(view.children[-1].children[1].value) == first
    assert calls["build"] == 2   # one static layer per key (2 bars, 4 bars), drawn once each


def test_the_live_png_shows_what_the_ordinary_figure_shows():
    calls = {"build": 0}
    bars = _bar_figure(calls)
    for values in ([3, 5], [9, 1], [3, 5]):   # the same key: the values drawn over one layer
        fig = bars.figure(values)
        fig.set_facecolor("white")
        fig.canvas.draw()
        ordinary = np.asarray(fig.canvas.buffer_rgba())[:, :, :3].astype(int)
        plt.close(fig)
        diff = np.abs(_pixels(bars.png(values)) - ordinary)
        # the same picture; values are drawn over the static layer (its axis line included),
        # so a few edge pixels blend in another order
        assert diff.max() <= 32 and (diff > 0).any(axis=2).mean() < 0.005
    assert calls["build"] == 4   # three ordinary figures, one live layer


def test_the_png_writer_round_trips_the_pixels():
    pixels = np.random.default_rng(0).integers(0, 256, (5, 7, 4), dtype=np.uint8)
    png = live.png_of(pixels)
    assert isinstance(png, Png) and (_pixels(png) == pixels[:, :, :3]).all()


def test_the_cache_keeps_its_budget_and_the_layer_just_used(monkeypatch):
    calls = {"build": 0}
    bars = _bar_figure(calls)
    monkeypatch.setattr(live, "CACHE_BYTES", 1)
    bars.png([1, 2])
    bars.png([1, 2, 3])
    assert len([k for k in live._CACHE if k[0] == id(bars)]) == 1
    bars.png([1, 2])   # evicted: built again
    assert calls["build"] == 3


def test_prepare_renders_the_static_layer_once_and_the_png_only_adds_the_values(monkeypatch):
    calls = {"build": 0}
    bars = _bar_figure(calls)
    updates = []
    real = bars.update
    monkeypatch.setattr(bars, "update", lambda *a: updates.append(a[-1]) or real(*a))
    bars.prepare([9, 9, 9])
    assert calls["build"] == 1 and updates == []            # static layer only, no value drawn
    bars.prepare([1, 1, 1])                                 # same key: kept, not built again
    png = bars.png([1, 2, 3])
    assert calls["build"] == 1 and updates == [[1, 2, 3]]
    fig = _bar_figure({"build": 0}).figure([1, 2, 3])
    fig.set_facecolor("white")
    fig.canvas.draw()
    ordinary = np.asarray(fig.canvas.buffer_rgba())[:, :, :3].astype(int)
    plt.close(fig)
    assert (np.abs(_pixels(png) - ordinary) > 0).any(axis=2).mean() < 0.005


@pytest.mark.parametrize("item", [Figure(figsize=(2, 1)), "text"])
def test_other_items_still_show(item):
    view = live_view([[widgets.IntSlider()]], lambda: [item])
    [shown] = view.children[-1].children
    assert isinstance(shown, widgets.Image if isinstance(item, Figure) else widgets.HTML)


def test_a_setting_run_again_reuses_every_explorer_figures_static_layer():
    """The key of each live figure names what its static layer draws: a second run of the same
    setting (new timings, same picture) must find the layer the first one rendered."""
    from mtb_helpers.check import (check_context_parallel, check_grid, check_moe,
                                   check_sequence_parallel, check_tp_mlp)
    from mtb_helpers.cp.plots import LIVE_RING
    from mtb_helpers.grid.plots import LIVE_GRID
    from mtb_helpers.moe.plots import LIVE_ROUTING, LIVE_TOKENS, _moe_error_figure
    from mtb_helpers.plots.errors import ErrorFigure, error_figure
    from mtb_helpers.sp.plots import _layout_data, _layout_key
    from mtb_helpers.tp.plots import _steps_key

    def keys(report) -> list:
        found = [ErrorFigure.key(error_figure(report, "quantity"))]
        if report.check == "tp_mlp":
            found.append(_steps_key((report, [s for s in report.steps if s.phase == "forward"], False)))
        if report.check == "sequence_parallel":
            found.append(_layout_key(_layout_data(report, "forward", 10.0)))
        if "grid" in report.extra:
            found.append(LIVE_GRID.key((report, None)))
        if "cp" in report.extra:
            found.append(LIVE_RING.key((report.extra["cp"], "")))
        if "moe" in report.extra:
            moe = report.extra["moe"]
            found += [LIVE_ROUTING.key((moe, None)), LIVE_TOKENS.key(moe),
                      ErrorFigure.key(_moe_error_figure(report))]
        return found

    for check, kwargs in ((check_tp_mlp, {}), (check_sequence_parallel, {}),
                          (check_grid, {"tp": 2, "dp": 2}), (check_moe, {}),
                          (check_context_parallel, {"seq": 24, "dtype": "float64"})):
        assert keys(check(world_size=4, **kwargs)) == keys(check(world_size=4, **kwargs)), check
