"""The capstone explorer: its summary shows the per-step verdict (the rows that catch a wrong
update the re-anchored loss cannot see), the one-process run is reused across layouts, and the
two-layer loss figure shows what its ordinary figure shows."""
from __future__ import annotations

import io

import matplotlib
import numpy as np
import torch

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from PIL import Image  # noqa: E402

from mtb_helpers.capstone.check import check_capstone, free_run  # noqa: E402
from mtb_helpers.capstone.model import GPTConfig  # noqa: E402
from mtb_helpers.capstone.reference import TrainConfig, train_reference  # noqa: E402
from mtb_helpers.capstone.widget import LIVE_LOSSES, capstone_summary, losses_png  # noqa: E402


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
    for parallel in ([3.47, 3.25 + 1e-15, 3.11], [3.47, 3.30, 3.20]):
        data = (parallel, reference, "tp=2 pp=2", "title")
        fig = LIVE_LOSSES.figure(data)
        fig.set_facecolor("white")
        fig.canvas.draw()
        ordinary = np.asarray(fig.canvas.buffer_rgba())[:, :, :3].astype(int)
        plt.close(fig)
        diff = np.abs(_pixels(losses_png(*data)) - ordinary)
        assert diff.max() <= 64 and (diff > 0).any(axis=2).mean() < 0.005
    same = LIVE_LOSSES.key(([3.47, 3.25, 3.11], reference, "x", "a"))
    assert same == LIVE_LOSSES.key(([3.47, 3.25 + 1e-14, 3.11], reference, "x", "b"))
    assert same != LIVE_LOSSES.key(([3.47, 3.30, 3.20], reference, "x", "a"))   # errors of 1e-2


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
