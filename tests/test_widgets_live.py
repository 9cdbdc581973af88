"""The explorers' shared frame: re-render on every control change, survive a failing render."""
from __future__ import annotations

import ipywidgets as widgets

from mtb_helpers.widgets.frame import live_view


def test_renders_on_each_change_and_a_failure_is_one_line_not_a_dead_explorer(capsys):
    size = widgets.IntSlider(value=2, min=1, max=4)

    def render() -> list:
        if size.value == 3:
            raise ValueError("3 does not divide 8")
        return [f"ran with {size.value}"]

    view = live_view([[size]], render)
    assert view.children[0].children == (size,)
    assert "ran with 2" in capsys.readouterr().out
    size.value = 3
    assert "ValueError: 3 does not divide 8" in capsys.readouterr().out
    size.value = 4
    assert "ran with 4" in capsys.readouterr().out
