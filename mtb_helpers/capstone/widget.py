"""Capstone explorer: choose tp / pp / dp / cp (only layouts whose sizes divide), the steps, the DP
strategy and a deliberate bug; see the loss curves, who holds what, or the bytes per group.

The loss curves are ``plots.losses_png``: their static layer is drawn once per number of steps, a
move draws only the parallel run's points. The figures read the report's ``extra`` as it is (no
``to_dict()``: 0.1-0.2 s a move for nothing shown). While the ranks start (~1.2 s for 4), the
explorer makes the one-process run and the loss figure's static layer (``_prepare``).
"""
from __future__ import annotations

import math

import ipywidgets as widgets
import torch

from mtb_helpers.capstone.bugs import CAPSTONE_BUGS
from mtb_helpers.capstone.check import check_capstone, free_run
from mtb_helpers.capstone.model import GPTConfig
from mtb_helpers.capstone.plots import (DEFAULT_TITLE, losses_png, plot_bytes, plot_rank_grid,
                                        prepare_losses)
from mtb_helpers.capstone.reference import TrainConfig
from mtb_helpers.capstone.validate import DP_STRATEGIES, admissible_layouts
from mtb_helpers.runtime.ranks import warm_up
from mtb_helpers.widgets.frame import bug_menu, chosen, live_view, menu

__all__ = ["explore_capstone", "capstone_summary", "layout_options"]

VIEWS = ("loss curves", "who holds what", "bytes per group")


def layout_options(world_sizes=(1, 2, 4, 8)) -> list[str]:
    """``"tp=2 pp=2 dp=2 cp=1"`` for every admissible layout (string options: ipywidgets 7)."""
    return [str(layout) for layout in admissible_layouts(world_sizes)]


def _parse(option: str) -> dict[str, int]:
    return {k: int(v) for k, v in (part.split("=") for part in option.split())}


def capstone_summary(report) -> str:
    """Verdict, the worst loss, step and parameter errors against their tolerances (each step is
    judged on its own: the reference takes it from the parallel run's state), bytes of rank 0."""
    def worst(quantity: str):
        return max((r for r in report.rows if r.quantity == quantity), key=lambda r: r.max_abs_err)

    loss, step, params = worst("loss"), worst("step"), worst("params")
    # one "step" row per step, in step order (capstone/check.py: StepComparison.on_call)
    failed = [r.note.split(";")[0] for r in report.rows if r.quantity == "step" and not r.passed]
    sent = report.extra["bytes"]["per_rank"][0]
    return "\n".join([
        report.title().split(" [")[0] + (" PASSED" if report.passed else " FAILED"),
        f"worst loss error {loss.max_abs_err:.1e} ({loss.note}), tolerance {loss.tolerance:.0e}",
        f"worst step error {step.max_abs_err:.1e} ({step.note}: all parameters after the step "
        f"against one process taking it from the same state), tolerance {step.tolerance:.0e}"
        + (f"; wrong at {', '.join(failed)}" if failed else ""),
        f"worst parameter error {params.max_abs_err:.1e} (rank {params.rank}), "
        f"tolerance {params.tolerance:.0e}",
        "rank 0 sends per step: " + ", ".join(f"{g} {b} B" for g, b in sent.items())])


def _prepare(option: str, steps: int) -> None:
    """Start the ranks of ``option`` in the background; meanwhile run the one-process run
    (``free_run``, cached for the check) and draw the loss figure's static layer."""
    warm_up(math.prod(_parse(option).values()))
    reference = free_run(GPTConfig(), TrainConfig(steps=steps), torch.float64).losses
    prepare_losses(reference, option)


def explore_capstone(layout: str = "tp=2 pp=2 dp=2 cp=1", steps: int = 2) -> widgets.VBox:
    """The explorer; display it. Each change trains again. It opens at 2 steps: every bug fails its
    step check from step 1 and parts the loss curves by step 2 (a step more costs ~40 %)."""
    options = layout_options()
    choose = menu("layout", options, layout if layout in options else None)
    n_steps = widgets.IntSlider(value=steps, min=2, max=8, description="steps",
                                continuous_update=False)
    strategy = menu("DP", DP_STRATEGIES, "ddp")
    bug = bug_menu(CAPSTONE_BUGS)
    view = menu("show", VIEWS)

    def render():
        sizes = _parse(choose.value)
        report = check_capstone(**sizes, steps=n_steps.value, strategy=strategy.value,
                                bug=chosen(bug))
        data = report.extra
        if view.value == "loss curves":
            fig = losses_png(data["losses"]["parallel"], data["losses"]["reference"],
                             choose.value + ("" if bug.value == "none" else f" + {bug.value}"),
                             title=DEFAULT_TITLE if report.passed
                             else "Loss per step: the curves part")
        elif view.value == "who holds what":
            fig = plot_rank_grid(data["grid"], sizes)
        else:
            fig = plot_bytes(data["bytes"])
        return [fig, capstone_summary(report)]

    _prepare(choose.value, n_steps.value)
    return live_view([[choose, n_steps], [strategy, bug, view]], render)
