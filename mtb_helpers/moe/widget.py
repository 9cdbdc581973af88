"""The expert-parallel explorer: change the world size, the number of experts, top-k, the
capacity factor or inject a bug, and ``check_moe`` re-runs on real ranks; the summary, the
routing, the tokens per expert and the error figure redraw. A refused setting (experts not
divisible by the world size, top-k above the experts) prints its ValueError instead."""
from __future__ import annotations

import ipywidgets as widgets

from mtb_helpers.moe.check import check_moe
from mtb_helpers.moe.bugs import MOE_BUGS
from mtb_helpers.moe.plots import expert_group, moe_errors_png, routing_png, tokens_per_expert_png
from mtb_helpers.checking.report import Report
from mtb_helpers.widgets.frame import SLIDER, bug_menu, chosen, live_view, world_size_slider

CAPACITY_FACTORS = [("none (keep all)", None), ("0.5", 0.5), ("1.0", 1.0), ("1.25", 1.25),
                    ("2.0", 2.0)]


def summary(report: Report) -> str:
    """Verdict, failing quantities, what was dropped and what rank 0 sent."""
    moe = report.extra["moe"]
    failed = sorted({expert_group(r.quantity) for r in report.failed()})
    verdict = "PASS" if report.passed else f"FAIL ({', '.join(failed)})"
    by = moe["bytes"]
    return (f"{verdict}: bug={report.config['bug']}; {sum(moe['dropped_per_expert'])} choice(s) "
            f"dropped; rank 0 sent {by['counts'][0]} B of counts, {by['dispatch'][0]} B dispatch, "
            f"{by['combine'][0]} B combine (all-gather + reduce-scatter would send "
            f"{by['all_gather_alternative'][0]} B)")


def explore_moe(world_size: int = 2, num_experts: int = 4) -> widgets.VBox:
    """The MoE explorer widget; display it."""
    size = world_size_slider(world_size)
    experts = widgets.Dropdown(options=[2, 4, 8], value=num_experts, description="experts E")
    top_k = widgets.IntSlider(value=1, min=1, max=2, description="top-k", **SLIDER)
    capacity = widgets.Dropdown(options=CAPACITY_FACTORS, value=None, description="capacity c")
    bug = bug_menu(MOE_BUGS)
    def render() -> list:
        report = check_moe(world_size=size.value, num_experts=experts.value, top_k=top_k.value,
                           capacity_factor=capacity.value, bug=chosen(bug))
        moe = report.extra["moe"]
        return [summary(report), routing_png(moe), tokens_per_expert_png(moe),
                moe_errors_png(report)]

    return live_view([[size, experts, top_k], [capacity, bug]], render)
