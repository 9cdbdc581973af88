"""The pipeline explorer's figure (notebook 09): the measured chart drawn over a static layer of
the simulated one shows what the ordinary figure shows, and a run a little slower or faster than
the last keeps that layer."""
from __future__ import annotations

import io

import matplotlib
import numpy as np

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from PIL import Image  # noqa: E402

from mtb_helpers.plots import live  # noqa: E402
from mtb_helpers.pp import schedule, simulate  # noqa: E402
from mtb_helpers.pp.measured_plots import (LIVE_MEASURED, measured_vs_simulated_png,  # noqa: E402
                                           plot_measured_vs_simulated)


def _pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)


def _timelines(name: str, slower: float, chunks: int | None = None):
    ops = schedule(name, 4, 8, chunks)
    return simulate(ops, 0.01 * slower, 0.02 * slower), simulate(ops, 0.01, 0.02)


def _ordinary(measured, simulated, name) -> np.ndarray:
    fig = plot_measured_vs_simulated(measured, simulated, name, width=9.5)
    fig.canvas.draw()
    pixels = np.asarray(fig.canvas.buffer_rgba())[:, :, :3].astype(int)
    plt.close(fig)
    return pixels


def test_the_explorers_png_shows_the_ordinary_figure():
    for name, chunks in (("1f1b", None), ("interleaved", 2)):
        for slower in (1.05, 1.08):   # two runs on one static layer
            measured, simulated = _timelines(name, slower, chunks)
            diff = np.abs(_pixels(measured_vs_simulated_png(measured, simulated, name, width=9.5))
                          - _ordinary(measured, simulated, name))
            assert diff.max() <= 64 and (diff > 0).any(axis=2).mean() < 0.005, (name, slower)


def test_a_slightly_different_run_keeps_the_static_layer_and_a_much_slower_one_widens_the_axis():
    fast, simulated = _timelines("1f1b", 0.97)   # runs on either side of the prediction
    slow, _ = _timelines("1f1b", 1.07)
    late, _ = _timelines("1f1b", 1.4)
    key = LIVE_MEASURED.key
    assert key((fast, simulated, "1f1b", "s", 9.5, 0.0)) == key((slow, simulated, "1f1b", "s", 9.5, 0.0))
    assert key((late, simulated, "1f1b", "s", 9.5, 0.0)) != key((fast, simulated, "1f1b", "s", 9.5, 0.0))
    # the measured boxes are values: two runs on one layer give two pictures
    first = measured_vs_simulated_png(fast, simulated, "1f1b", width=9.5)
    assert measured_vs_simulated_png(slow, simulated, "1f1b", width=9.5) != first
    assert len([k for k in live._CACHE if k[0] == id(LIVE_MEASURED)]) >= 1
    # every box of the measured run reaches the picture: the last op ends where the run ends
    fig = plot_measured_vs_simulated(late, simulated, "1f1b")
    bottom = fig.axes[1]
    assert bottom.get_xlim()[1] >= late.makespan and "makespan 0.462 s" in bottom.get_title()
    plt.close(fig)


def test_a_prediction_with_message_times_says_so_in_its_title():
    ops = schedule("1f1b", 4, 8)
    simulated = simulate(ops, 0.005, 0.01, latency=0.0004)
    measured = simulate(ops, 0.0051, 0.0102, latency=0.0004)
    fig = plot_measured_vs_simulated(measured, simulated, "1f1b", latency=0.0004)
    assert "each message 0.4 ms" in fig.axes[0].get_title()
    plain = plot_measured_vs_simulated(measured, simulate(ops, 0.005, 0.01), "1f1b")
    assert "message" not in plain.axes[0].get_title()
    plt.close(fig)
    plt.close(plain)


def test_measured_rows_are_named_as_the_simulated_ones():
    # interleaved: a row is a rank holding several virtual stages, on both charts
    for name, chunks, row in (("1f1b", None, "stage"), ("interleaved", 2, "rank")):
        measured, simulated = _timelines(name, 1.05, chunks)
        fig = plot_measured_vs_simulated(measured, simulated, name)
        top, bottom = fig.axes[0], fig.axes[1]
        for ax in (top, bottom):
            assert [t.get_text() for t in ax.get_yticklabels()] == [f"{row} {r}" for r in (3, 2, 1, 0)]
        assert bottom.get_ylabel() == top.get_ylabel() and bottom.get_ylabel().startswith(row)
        plt.close(fig)
