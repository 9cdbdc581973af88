"""Notebook 09's explorer on ranks: every prediction it prints is made before the run it is
compared with (the hop α included), and its interleaved op time follows the check's chunk count."""
from __future__ import annotations

import html

import ipywidgets as widgets
import matplotlib
import pytest

matplotlib.use("Agg")

from mtb_helpers.pp import check as pp_check  # noqa: E402
from mtb_helpers.pp import widget as pp_widget  # noqa: E402
from mtb_helpers.pp.result import PipelineResult  # noqa: E402

OP_TIME = (0.002, 0.004)


def shown(frame) -> str:
    """The explorer's texts, as the HTML widgets below its controls hold them."""
    return "\n".join(html.unescape(w.value) for w in frame.items.children
                     if isinstance(w, widgets.HTML))


def test_the_first_runs_prediction_uses_a_hop_measured_before_that_run(monkeypatch):
    calls, running = [], []
    real_check, real_sim = pp_check.check_pipeline, pp_check.simulated_for

    def measure(stages, op_time):   # stands in for the small step that measures α first
        calls.append(("measure", stages))
        return 0.00777

    def simulated_for(*args, latency=0.0, **kwargs):
        if not running:   # the explorer's prediction (the check's own simulation runs inside it)
            calls.append(("predict", latency))
        return real_sim(*args, latency=latency, **kwargs)

    def check_pipeline(*args, **kwargs):
        calls.append(("run",))
        running.append(1)
        try:
            return real_check(*args, **kwargs)
        finally:
            running.pop()

    monkeypatch.setattr(pp_widget, "measure_hop_latency", measure)
    monkeypatch.setattr(pp_check, "simulated_for", simulated_for)
    monkeypatch.setattr(pp_check, "check_pipeline", check_pipeline)
    # what the run itself measures: the explorer before this fix predicted its first run with it
    monkeypatch.setattr(PipelineResult, "hop_latency", property(lambda self: 0.00999))

    frame = pp_widget.explore_pipeline_on_ranks("gpipe", stages=2, microbatches=2, op_time=OP_TIME)
    out = shown(frame)
    assert "check against one process: PASSED" in out
    assert "each message between ranks 7.77 ms (the hop α measured before the first run" in out
    assert "9.99" not in out
    assert calls == [("measure", 2), ("predict", 0.00777), ("run",)]

    frame.children[1].children[0].value = 3                  # micro-batches: α is kept
    assert "each message between ranks 7.77 ms" in shown(frame)
    assert calls[3:] == [("predict", 0.00777), ("run",)]
    frame.children[0].children[1].value = 1                  # stages: one more measurement first
    assert calls[5:] == [("measure", 1), ("predict", 0.00777), ("run",)]


def test_a_refused_setting_starts_no_rank_not_even_to_measure_the_hop(monkeypatch):
    measured = []
    monkeypatch.setattr(pp_widget, "measure_hop_latency", lambda p, t: measured.append(p) or 0.0)
    monkeypatch.setattr(pp_check, "check_pipeline", lambda *a, **k: pytest.fail("ranks started"))
    frame = pp_widget.explore_pipeline_on_ranks("interleaved", stages=2, microbatches=3)
    assert "divisible by stages" in shown(frame) and measured == []


def test_the_hop_is_measured_on_its_own_small_step():
    alpha = pp_widget.measure_hop_latency(2, OP_TIME)
    assert 0 < alpha < OP_TIME[0]   # a message between two ranks: well under one op


def test_one_stage_has_no_hop_and_starts_no_rank(monkeypatch):
    from mtb_helpers.pp import runtime
    monkeypatch.setattr(runtime, "run", lambda *a, **k: pytest.fail("a rank was started"))
    assert pp_widget.measure_hop_latency(1) == 0.0
    with pytest.raises(BaseException, match="a rank was started"):   # the patch does catch a start
        pp_widget.measure_hop_latency(2)


def test_the_interleaved_op_time_follows_the_checks_chunk_count(monkeypatch):
    monkeypatch.setattr(pp_check, "INTERLEAVED_CHUNKS", 3)
    monkeypatch.setattr(pp_widget, "measure_hop_latency", lambda p, t: 0.0)
    frame = pp_widget.explore_pipeline_on_ranks("interleaved", stages=2, microbatches=2,
                                                op_time=OP_TIME)
    out = shown(frame)
    assert "check against one process: PASSED" in out
    assert "F = 6 ms, B = 12 ms per stage (2 and 4 ms per chunk)" in out
