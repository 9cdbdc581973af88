"""The capstone explorer: its summary shows the per-step verdict (the rows that catch a wrong
update the re-anchored loss cannot see), the one-process run is reused across layouts, and the
two-layer loss figure shows what its ordinary figure shows."""
from __future__ import annotations

import io

import matplotlib
import numpy as np
import pytest
import torch

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from PIL import Image  # noqa: E402

from mtb_helpers.capstone.check import check_capstone, free_run  # noqa: E402
from mtb_helpers.capstone.model import GPTConfig  # noqa: E402
from mtb_helpers.capstone.reference import TrainConfig, train_reference  # noqa: E402
from mtb_helpers.capstone.plots import (DEFAULT_TITLE, LIVE_LOSSES, losses_data, losses_png,  # noqa: E402
                                        plot_losses, prepare_losses)
from mtb_helpers.capstone.widget import capstone_summary  # noqa: E402


def test_the_summary_names_the_steps_a_wrong_update_breaks():
    good = check_capstone(tp=2, steps=2)
    assert good.passed and "worst step error" in capstone_summary(good)
    assert "wrong at" not in capstone_summary(good)
    bad = check_capstone(tp=2, steps=2, bug="capstone-dp-allreduce-in-tp-group")
    text = capstone_summary(bad)
    assert not bad.passed and "FAILED" in text and "wrong at step 1, step 2" in text


def test_the_one_process_run_is_made_once_and_equals_the_reference_run():
    free_run.cache_clear()
    check_capstone(tp=2, steps=2)
    report = check_capstone(pp=2, steps=2)
    assert free_run.cache_info().hits >= 1 and free_run.cache_info().misses == 1
    ref = train_reference(GPTConfig(), TrainConfig(steps=2), torch.float64)
    assert report.extra["losses"]["reference"] == ref["losses"]
    run = free_run(GPTConfig(), TrainConfig(steps=2), torch.float64)
    assert all(torch.equal(run.params[n], p) for n, p in ref["params"].items())


def _pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)


def test_the_live_loss_figure_shows_the_ordinary_one_and_a_bug_widens_its_axes():
    reference = [3.47, 3.25, 3.11]
    for parallel in ([3.47, 3.25 + 1e-15, 3.11], [3.47, 3.30, 3.20], [3.47, float("nan"), None]):
        fig = plot_losses(parallel, reference, "tp=2 pp=2", title="title")
        fig.set_facecolor("white")
        fig.canvas.draw()
        ordinary = np.asarray(fig.canvas.buffer_rgba())[:, :, :3].astype(int)
        plt.close(fig)
        diff = np.abs(_pixels(losses_png(parallel, reference, "tp=2 pp=2", title="title")) - ordinary)
        assert diff.max() <= 64 and (diff > 0).any(axis=2).mean() < 0.005
    same = LIVE_LOSSES.key(losses_data([3.47, 3.25, 3.11], reference, "x", title="a"))
    assert same == LIVE_LOSSES.key(losses_data([3.47, 3.25 + 1e-14, 3.11], reference, "x", title="a"))
    assert same != LIVE_LOSSES.key(losses_data([3.47, 3.25, 3.11], reference, "x", title="b"))
    assert same != LIVE_LOSSES.key(losses_data([3.47, 3.30, 3.20], reference, "x"))   # errors of 1e-2
    assert same != LIVE_LOSSES.key(losses_data([3.47, 3.25, 3.11], reference, "x", {"y": reference}))


def test_the_notebook_figure_and_the_explorer_image_are_one_build_and_update(monkeypatch):
    """plot_losses (notebook 12, the CLI's --plot) and losses_png (the explorer) call the same
    LiveFigure's build and update with the same data; no second drawing of the same picture."""
    calls = []
    for name in ("build", "update"):
        real = getattr(LIVE_LOSSES, name)
        monkeypatch.setattr(LIVE_LOSSES, name, lambda *a, _real=real, _name=name:
                            calls.append((_name, a[-1])) or _real(*a))
    reference, parallel = [3.0, 2.5, 2.25, 2.125], [3.0, 2.5, 2.25, 2.2]   # a key no test drew yet
    others = {"tp=2 dp=2 correct": reference}
    fig = plot_losses(parallel, reference, "bug", others, title="The curves part")
    png = losses_png(parallel, reference, "bug", others, title="The curves part")
    data = losses_data(parallel, reference, "bug", others, "The curves part")
    assert calls == [("build", data), ("update", data)] * 2
    top, bottom = fig.axes
    assert top.get_title() == "The curves part" and top.get_ylabel() and bottom.get_xlabel() == "step"
    assert [t.get_text() for t in top.get_legend().get_texts()] == ["one process", "bug",
                                                                    "tp=2 dp=2 correct"]
    assert [t.get_text() for t in bottom.get_legend().get_texts()] == ["fp64 tolerance 1e-10"]
    assert len(top.lines) == 3 and len(bottom.lines) == 3   # reference + 2 runs; tolerance + 2 runs
    assert list(bottom.lines[1].get_ydata()) == [1e-17, 1e-17, 1e-17, pytest.approx(0.075)]
    fig.set_facecolor("white")
    fig.canvas.draw()
    ordinary = np.asarray(fig.canvas.buffer_rgba())[:, :, :3].astype(int)
    plt.close(fig)
    assert (np.abs(_pixels(png) - ordinary) > 0).any(axis=2).mean() < 0.005


def test_prepare_losses_keeps_the_layer_a_correct_runs_redraw_uses(monkeypatch):
    built = []
    real = LIVE_LOSSES.build
    monkeypatch.setattr(LIVE_LOSSES, "build", lambda *a: built.append(a[-1]) or real(*a))
    reference = [3.5, 3.125, 2.875]                          # a curve no other test drew
    prepare_losses(reference, "tp=2 pp=2 dp=1 cp=1")
    assert len(built) == 1
    losses_png([3.5, 3.125 + 1e-15, 2.875], reference, "tp=2 pp=2 dp=1 cp=1", title=DEFAULT_TITLE)
    assert len(built) == 1                                   # the redraw drew only its points
    losses_png([3.5, 3.5, 3.5], reference, "tp=2 pp=2 dp=1 cp=1", title="the curves part")
    assert len(built) == 2                                   # another title, another layer


def test_the_explorer_trains_again_on_every_change_and_shows_the_verdict():
    import html

    import ipywidgets as widgets

    from mtb_helpers.capstone.widget import explore_capstone

    def shown(frame) -> str:
        return "\n".join(html.unescape(w.value) for w in frame.items.children
                         if isinstance(w, widgets.HTML))

    frame = explore_capstone(layout="tp=2 pp=1 dp=1 cp=1", steps=2)
    (layout, _), (_, bug, _) = (row.children for row in frame.children[:2])
    assert "PASSED" in shown(frame) and "worst step error" in shown(frame)
    [image] = [w for w in frame.items.children if isinstance(w, widgets.Image)]
    first = bytes(image.value)
    bug.value = "capstone-dp-allreduce-in-tp-group"
    assert "FAILED" in shown(frame) and "wrong at step 1, step 2" in shown(frame)
    assert bytes(image.value) != first
