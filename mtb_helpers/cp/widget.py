"""The context-parallel explorers:

* ``explore_context_parallel()``: world size, variant, layout, causal mask and a bug; the check
  re-runs on real ranks and the summary, the ring steps (ring variant) and the error figure redraw.
  The bug list offers only the bugs that can show under the other controls (their ``needs``).
* ``explore_balance()``: a world-size slider; the causal check runs with both layouts (one call
  to the ranks) and the work per rank is drawn side by side.
A setting the check refuses (a sequence the layout cannot cut) prints its ValueError instead.
"""
from __future__ import annotations

import ipywidgets as widgets

from mtb_helpers.checking.report import Report
from mtb_helpers.checking.bug import names_for
from mtb_helpers.cp.bugs import BUGS
from mtb_helpers.cp.check import check_context_parallel, check_layouts
from mtb_helpers.cp.plots import ring_steps_png, work_png
from mtb_helpers.plots.errors import errors_png
from mtb_helpers.widgets.frame import bug_menu, chosen, live_view, menu, world_size_slider

__all__ = ["explore_context_parallel", "explore_balance", "summary"]

SEQ = 24   # 2·cp divides it for every cp in 1..4, so both layouts cut it evenly


def summary(report: Report) -> str:
    """Verdict, failing quantities, work and bytes of every rank."""
    cp = report.extra["cp"]
    failed = sorted({r.quantity for r in report.failed()})
    verdict = "PASS" if report.passed else f"FAIL ({', '.join(failed)})"
    return (f"{verdict}: {report.config['variant']}, {report.config['layout']}, "
            f"{'causal' if report.config['causal'] else 'no mask'}, bug={report.config['bug']}\n"
            f"scores computed per rank: {cp['work']['forward']} (max/mean "
            f"{cp['work']['imbalance']:.2f}); bytes sent per rank forward "
            f"{cp['bytes']['forward'][0]} B, backward {cp['bytes']['backward'][0]} B; "
            f"K/V held {cp['kv_peak_bytes'][0]} B")


def explore_context_parallel(world_size: int = 4) -> widgets.VBox:
    """The context-parallel explorer widget; display it."""
    size = world_size_slider(world_size, "world size cp")
    variant = menu("variant", ["ring", "allgather"])
    layout = menu("layout", ["contiguous", "zigzag"])
    causal = widgets.Checkbox(value=True, description="causal mask")
    bug = bug_menu([])
    view: list = []   # the explorer, once built: the bug list changes without redrawing it

    def offer(*_) -> None:
        """Offer the bugs that can show under the other controls; keep the choice if it can."""
        names = names_for(BUGS, f"cp-{variant.value}", world_size=size.value, causal=causal.value,
                          layout=layout.value)
        if tuple(bug.options) == ("none", *names):
            return
        keep = bug.value if bug.value in names else "none"
        for v in view:    # a new list resets the value: no redraw for that passing "none"
            bug.unobserve(v.redraw, names="value")
        bug.options = ["none", *names]
        bug.value = keep
        for v in view:
            bug.observe(v.redraw, names="value")

    # observed before the explorer's own redraw, so the redraw sees the list already filtered
    for control in (size, variant, layout, causal):
        control.observe(offer, names="value")
    offer()

    def render() -> list:
        report = check_context_parallel(world_size=size.value, seq=SEQ,
                                        causal=causal.value, variant=variant.value,
                                        layout=layout.value, dtype="float64", bug=chosen(bug))
        items: list = [summary(report)]
        if variant.value == "ring":
            items.append(ring_steps_png(report.extra["cp"]))
        return items + [errors_png(report, by="quantity")]

    view.append(live_view([[size, variant, layout], [causal, bug]], render))
    return view[0]


def explore_balance(world_size: int = 4, variant: str = "ring") -> widgets.VBox:
    """Work per rank under a causal mask, contiguous vs zigzag, for the chosen world size."""
    size = world_size_slider(world_size, "world size cp")

    def render() -> list:
        cp = size.value
        reports = check_layouts(world_size=cp, seq=SEQ, causal=True, variant=variant,
                                layouts=("contiguous", "zigzag"), dtype="float64")
        work = {layout: rep.extra["cp"]["work"]["forward"] for layout, rep in reports.items()}
        verdict = {layout: "PASS" if rep.passed else "FAIL" for layout, rep in reports.items()}
        return [f"s = {SEQ}, cp = {cp}: contiguous {work['contiguous']}, zigzag "
                f"{work['zigzag']} scores per (batch, head); check against one process: "
                f"contiguous {verdict['contiguous']}, zigzag {verdict['zigzag']}",
                work_png(work, title=f"Causal work per rank, {cp} rank{'s' * (cp > 1)}")]

    return live_view([[size]], render)
