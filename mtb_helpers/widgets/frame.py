"""The frame every explorer shares: controls on top, below them one widget per item the explorer
shows (a text, a table, a figure), updated in place whenever a control changes.

A text is an ``HTML`` widget, a figure an ``Image`` widget, a table an ``HTML`` widget, each
keeping its place, so the front end never rebuilds the output area and a value equal to the
last one is not sent again (traitlets only syncs changes). Core ipywidgets only (HTML, Image,
Output, VBox, observe): 7.7 and 8 alike. Below it, the controls the explorers share (the world-size
slider, the bug menu, plain menus), made the same way in every topic.
"""
from __future__ import annotations

import html
import io
from typing import Callable, Sequence

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display
from matplotlib.figure import Figure

from mtb_helpers.plots.live import Png

__all__ = ["live_view", "ExplorerView", "SLIDER", "world_size_slider", "menu", "bug_menu", "chosen"]

MAX_RANKS = 4   # Binder has 1 CPU and 2 GB; the figures are drawn for a few ranks
# redraw on release, not on every step of a drag (each redraw runs a check or draws a chart)
SLIDER = {"continuous_update": False, "style": {"description_width": "initial"}}
TEXT_STYLE = "margin: 0; white-space: pre-wrap; font-size: 12px; line-height: 1.35"


def _png_bytes(fig: Figure) -> bytes:
    """An ordinary figure as PNG, drawn once and closed: the inline backend's
    ``bbox_inches="tight"`` draws every figure twice (once to measure it)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=fig.dpi, facecolor="white",
                pil_kwargs={"compress_level": 1})
    plt.close(fig)
    return buf.getvalue()


def _kind(item: object) -> str:
    if isinstance(item, str):
        return "text"
    if isinstance(item, (Png, Figure)):
        return "image"
    return "html" if hasattr(item, "_repr_html_") else "other"


def _text_html(text: str) -> str:
    return f'<pre style="{TEXT_STYLE}">{html.escape(text)}</pre>'


class ExplorerView(widgets.VBox):
    """The explorer: ``rows`` of controls, then one widget per item of ``render()`` (a str is
    shown as text, a Figure or ``Png`` as an image, anything with ``_repr_html_`` as HTML (a
    check report is its table), anything else displayed in an Output). Every control change
    calls ``render`` again and updates those widgets in place; when the kinds of the items
    change (another view), the widgets are made again. An exception (a setting a check
    refuses, a rank error or timeout) is shown as one line and the explorer stays usable."""

    def __init__(self, rows: Sequence[Sequence[widgets.Widget]],
                 render: Callable[[], Sequence[object]]) -> None:
        self.render = render
        self.items = widgets.VBox()
        self._kinds: tuple[str, ...] = ()
        super().__init__([widgets.HBox(list(row)) for row in rows] + [self.items])
        for row in rows:
            for control in row:
                control.observe(self.redraw, names="value")
        self.redraw()

    def redraw(self, *_) -> None:
        try:
            items = list(self.render())
        except Exception as exc:  # noqa: BLE001  (say it, keep the explorer alive)
            items = [f"{type(exc).__name__}: {exc}"]
        kinds = tuple(_kind(item) for item in items)
        if kinds != self._kinds or "other" in kinds:
            self.items.children = [self._widget(kind) for kind in kinds]
            self._kinds = kinds
        for item, kind, widget in zip(items, kinds, self.items.children):
            if kind == "text":
                widget.value = _text_html(item)
            elif kind == "image":
                widget.value = item if isinstance(item, Png) else _png_bytes(item)
            elif kind == "html":
                widget.value = item._repr_html_()
            else:
                with widget:
                    display(item)

    @staticmethod
    def _widget(kind: str) -> widgets.Widget:
        if kind == "image":  # never wider than the notebook; the PNG keeps its aspect
            return widgets.Image(format="png", layout=widgets.Layout(max_width="100%",
                                                                     height="auto"))
        return widgets.Output() if kind == "other" else widgets.HTML()


live_view = ExplorerView   # the name the explorers (and notebook 10's own) are built with


def world_size_slider(value: int, description: str = "world size p") -> widgets.IntSlider:
    """1 to ``MAX_RANKS`` ranks."""
    return widgets.IntSlider(value=value, min=1, max=MAX_RANKS, description=description, **SLIDER)


def menu(description: str, options: Sequence, value: object = None) -> widgets.Dropdown:
    """A dropdown of ``options``, at ``value`` (default: the first)."""
    options = list(options)
    return widgets.Dropdown(options=options, value=options[0] if value is None else value,
                            description=description)


def bug_menu(names: Sequence[str], value: str | None = None) -> widgets.Dropdown:
    """"none" and the bugs ``names``, plain strings: a None option reads as "nothing selected"
    on ipywidgets 7 and 8 alike. :func:`chosen` reads it."""
    return menu("bug", ["none", *names], value)


def chosen(bug: widgets.Dropdown) -> str | None:
    """A bug menu's choice, None for "none"."""
    return None if bug.value == "none" else bug.value
