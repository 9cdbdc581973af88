"""Sequence-parallel explorer: world size, sequence length, dropout and a deliberate bug; see who
holds which sequence rows, the errors, and the memory each rank saves. Every change re-runs
``check_sequence_parallel`` on warm ranks (a fraction of a second)."""
from __future__ import annotations

import ipywidgets as widgets

from mtb_helpers.plots.errors import errors_png
from mtb_helpers.widgets.frame import SLIDER, bug_menu, chosen, live_view, menu, world_size_slider
from mtb_helpers.sp.check import check_sequence_parallel
from mtb_helpers.sp.plots import sequence_layout_png
from mtb_helpers.checking.report import Report
from mtb_helpers.sp.bugs import SP_BUGS

__all__ = ["sp_summary", "explore_sequence_parallel"]

VIEWS = ("forward: sequence rows", "backward: sequence rows", "errors per quantity", "errors per step")


def sp_summary(report: Report) -> str:
    """A few lines: verdict, failing quantities by rank, activation bytes TP vs SP, bytes sent."""
    lines = [report.title(), *report.failure_lines()]
    mem = report.extra["activation_memory"]["variants"]
    tp, sp = mem["tp"], mem["sp"]
    lines.append(f"saved for backward per rank: TP only {tp['measured_total']} B, TP + SP "
                 f"{sp['measured_total']} B (model {tp['model_total']} B / {sp['model_total']} B)")
    lines.append(f"sent per rank: TP {tp['communication']['activation_sent']} B, SP "
                 f"{sp['communication']['activation_sent']} B "
                 f"+ {sp['communication']['param_grad_sent']} B of LayerNorm/bias grad all-reduces")
    lines.append(f"collectives on rank 0: {report.records[0].summary()}")
    return "\n".join(lines)


def explore_sequence_parallel(world_size: int = 2, seq_len: int = 8, dropout_p: float = 0.1,
                              bug: str | None = None) -> widgets.VBox:
    """The explorer widget; display it (it is the last expression of a notebook cell)."""
    size = world_size_slider(world_size, "world size t")
    length = widgets.IntSlider(value=seq_len, min=1, max=16, description="sequence length s",
                               **SLIDER)
    dropout = widgets.FloatSlider(value=dropout_p, min=0.0, max=0.5, step=0.05,
                                  description="dropout_p", **SLIDER)
    broken = bug_menu(SP_BUGS, bug)
    view = menu("show", VIEWS)

    def render() -> list:
        try:
            report = check_sequence_parallel(world_size=size.value, seq_len=length.value,
                                             ffn_hidden=24, hidden=8, dropout_p=dropout.value,
                                             bug=chosen(broken),
                                             memory_variants=("tp", "sp"))   # what sp_summary shows
        except ValueError as exc:   # a length the world size does not divide: say why
            return [f"cannot run: {exc}"]
        if view.value.startswith("errors"):
            fig = errors_png(report, by="quantity" if "quantity" in view.value else "step")
        else:
            fig = sequence_layout_png(report, view.value.split(":")[0])
        return [fig, sp_summary(report)]

    return live_view([[size, length, dropout], [broken, view]], render)
