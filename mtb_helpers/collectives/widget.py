"""The collectives explorer: pick a world size, a collective and a tensor size; the collective runs
on real ranks and the figure and the bytes line redraw."""
from __future__ import annotations

import ipywidgets as widgets

from mtb_helpers.collectives.bugs import BUGS, COLLECTIVE_BUGS
from mtb_helpers.collectives.ops import COLLECTIVES
from mtb_helpers.collectives.check import check_collectives
from mtb_helpers.collectives.plots import FORMULA_LABEL, collective_png
from mtb_helpers.plots.live import Png
from mtb_helpers.widgets.frame import SLIDER, live_view, menu, world_size_slider


def render(world_size: int, collective: str, per_chunk: int,
           inject_bug: bool = False) -> tuple[Png, str]:
    """Run ``collective`` on ``world_size`` ranks with per_chunk·world_size elements; return its figure
    and a line comparing the bytes each rank sent with the formula."""
    bug = next((b for b, c in COLLECTIVE_BUGS.items() if c == collective), None) if inject_bug else None
    note, numel = "", per_chunk * world_size
    # the bug's own declared needs decide (2+ ranks, 2+ elements per chunk for all-to-all, ...)
    unmet = BUGS[bug].unmet(world_size=world_size, numel=numel, collectives=(collective,)) if bug else []
    if unmet:
        bug, note = None, f" (the bug needs {'; '.join(unmet)} to show)"
    report = check_collectives(world_size, numel, collectives=(collective,), bug=bug)
    rows = report.rows_for(collective)
    measured = [r["bytes_measured"] for r in rows]
    formula = [round(r["bytes_formula"]) for r in rows]
    text = (f"{'PASS' if report.passed else 'FAIL'}: {collective}, bug={bug}{note}. "
            f"n = {rows[0]['V_bytes']} B. Bytes sent per rank, measured: "
            f"{'n/a' if None in measured else measured}; formula {FORMULA_LABEL[collective]}: {formula}")
    return collective_png(report, collective), text


def collectives_explorer(world_size: int = 2, collective: str = "all-gather",
                         per_chunk: int = 2) -> widgets.VBox:
    """Sliders for the world size (1-4) and the elements per chunk (1-4), a dropdown for the
    collective and a checkbox injecting that collective's deliberate bug."""
    size = world_size_slider(world_size, "world size")
    which = menu("collective", COLLECTIVES, collective)
    chunk = widgets.IntSlider(value=per_chunk, min=1, max=4, description="per chunk", **SLIDER)
    bug = widgets.Checkbox(value=False, description="inject this collective's bug")
    def show() -> list:
        fig, text = render(size.value, which.value, chunk.value, bug.value)
        return [text, fig]

    return live_view([[size, which], [chunk, bug]], show)
