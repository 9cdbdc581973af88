"""The frame the rank-running explorers share: controls on top, one Output below that is filled
again whenever a control changes. Core ipywidgets only (observe, Output), so 7.7 and 8 alike."""
from __future__ import annotations

import io
from typing import Callable, Sequence

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import Image, display
from matplotlib.figure import Figure


def as_png(fig: Figure) -> Image:
    """The figure as a PNG, drawn once and closed: the inline backend's ``bbox_inches="tight"``
    draws every figure twice (once to measure it), which a slider pays on every move. The
    explorers' figures are laid out to fit their canvas, so nothing is cropped. Light compression:
    zlib's default level took ~10 ms of a slider move per figure for a few KB less to send."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=plt.rcParams["figure.dpi"], facecolor="white",
                pil_kwargs={"compress_level": 1})
    plt.close(fig)
    return Image(buf.getvalue())


def live_view(rows: Sequence[Sequence[widgets.Widget]],
              render: Callable[[], Sequence[object]]) -> widgets.VBox:
    """``rows`` of controls above an Output that shows ``render()``'s items in order: a string is
    printed, a Figure shown as a PNG drawn once (``as_png``), anything else (an HTML table)
    displayed. An exception
    (a setting a check refuses, a rank error or timeout) is shown as one line, and the explorer
    stays usable."""
    out = widgets.Output()

    def redraw(*_) -> None:
        with out:
            out.clear_output(wait=True)
            try:
                items = render()
            except Exception as exc:  # noqa: BLE001  (say it, keep the explorer alive)
                print(f"{type(exc).__name__}: {exc}")
                return
            for item in items:
                if isinstance(item, str):
                    print(item)
                else:
                    display(as_png(item) if isinstance(item, Figure) else item)

    for row in rows:
        for control in row:
            control.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox(list(row)) for row in rows] + [out])
