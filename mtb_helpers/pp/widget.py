"""Pipeline explorer: pick a schedule, stages, micro-batches, chunks and the backward/forward time
ratio; see the Gantt chart and the numbers next to the closed form. Pure simulation, no ranks.
``explore_pipeline_on_ranks`` runs each setting on real ranks (notebook 09)."""
from __future__ import annotations

import ipywidgets as widgets

from mtb_helpers.pp.plots import plot_gantt
from mtb_helpers.pp.schedules import SCHEDULES, closed_form, schedule, simulate
from mtb_helpers.widgets.frame import SLIDER, live_view, menu, world_size_slider

__all__ = ["pipeline_numbers", "explore_pipeline", "explore_pipeline_on_ranks", "measure_hop_latency"]


def pipeline_numbers(name: str, stages: int, microbatches: int, chunks: int = 2,
                     ratio: float = 2.0) -> tuple[str, object]:
    """Simulate one setting; return (the text the explorer prints, the timeline).

    ``ratio`` is backward time / forward time (forward = 1); zb-h1 splits the backward evenly
    into I and W. ``chunks`` only matters for interleaved. Raises ValueError for settings the
    schedule cannot take (e.g. interleaved with m not a multiple of p).
    """
    ops = schedule(name, stages, microbatches, chunks if name == "interleaved" else None)
    timeline = simulate(ops, forward=1.0, backward=ratio)
    ref = closed_form(name, stages, microbatches, ops.chunks, 1.0, ratio)
    note = "" if ref["exact"] else "  (closed form assumes m >= p and W <= min(F, I))"
    lines = [
        f"makespan {timeline.makespan:g}   (ideal, no bubble: {microbatches * (1 + ratio):g})",
        f"bubble fraction idle/(p x makespan): simulated {timeline.bubble_fraction:.3f}, "
        f"closed form {ref['bubble_fraction']:.3f}{note}",
        f"bubble ratio idle/busy:              simulated {timeline.bubble_ratio:.3f}, "
        f"closed form {ref['bubble_ratio']:.3f}   [{ref['source']}]",
        "peak activations per stage (whole-stage micro-batches): "
        + ", ".join(f"{x:g}" for x in timeline.peak_memory),
    ]
    return "\n".join(lines), timeline


def explore_pipeline(name: str = "1f1b", stages: int = 4, microbatches: int = 8, chunks: int = 2,
                     ratio: float = 2.0) -> widgets.VBox:
    """The explorer widget; display it (it is the last expression of a notebook cell)."""
    schedule_box = menu("schedule", SCHEDULES, name)
    stages_box = widgets.IntSlider(value=stages, min=1, max=8, description="stages p", **SLIDER)
    micro_box = widgets.IntSlider(value=microbatches, min=1, max=32,
                                  description="micro-batches m", **SLIDER)
    chunks_box = widgets.IntSlider(value=chunks, min=2, max=4,
                                   description="chunks v (interleaved)", **SLIDER)
    ratio_box = widgets.FloatSlider(value=ratio, min=0.5, max=4.0, step=0.5,
                                    description="backward / forward", **SLIDER)

    def render() -> list:
        try:
            text, timeline = pipeline_numbers(schedule_box.value, stages_box.value,
                                              micro_box.value, chunks_box.value, ratio_box.value)
        except ValueError as exc:  # a setting this schedule refuses: say why instead of a traceback
            return [f"cannot simulate: {exc}"]
        return [plot_gantt(timeline, schedule_box.value, width=9.5), text]

    return live_view([[schedule_box, stages_box, micro_box], [chunks_box, ratio_box]], render)


def measure_hop_latency(stages: int, op_time: tuple[float, float] = (0.005, 0.01)) -> float:
    """This machine's hop α between ``stages`` ranks (seconds), measured on its own: one small
    1F1B step (``stages`` micro-batches, ops held to ``op_time``) on the same ranks, its
    ``PipelineResult.hop_latency``. 0 on one stage (no messages), without starting a rank.

    The explorer calls it before the first run with each stage count, so the α a prediction is
    made with was measured before the run the prediction is compared with."""
    if stages == 1:
        return 0.0
    import torch
    import torch.nn.functional as F

    from mtb_helpers.pp.check import make_pipeline_model
    from mtb_helpers.pp.runtime import pipeline_step

    x = torch.zeros(2 * stages, 8)   # [m * 2 rows, h]: values do not matter, only the messages' time
    return pipeline_step(make_pipeline_model(stages), x, x, F.mse_loss, "1f1b", stages, stages,
                         op_time=op_time).hop_latency


def explore_pipeline_on_ranks(name: str = "1f1b", stages: int = 4, microbatches: int = 4,
                              op_time: tuple[float, float] = (0.005, 0.01)) -> widgets.VBox:
    """Notebook 09's explorer: one pipeline step on real ranks per setting (schedule, stages,
    micro-batches, recompute), its measured Gantt beside the predicted one, the check verdict and
    the measured makespan and bubble against the prediction, with the gaps.

    Ops are padded to ``op_time`` = (F, B) seconds. The prediction is ``simulate()`` with those
    op times and every message between ranks taking this machine's hop α: on one CPU a message
    costs a fraction of a millisecond (the sender's and the receiver's processes take turns),
    which at these op times is several per cent of the makespan. α is measured by
    ``measure_hop_latency`` (one small step on the same ranks) before the first run with each
    stage count and kept, so every run is predicted before it runs.

    It opens at ``microbatches=4``: every move waits for the whole step, under 1F1B (m + p - 1)
    held (F + B) ops, 105 ms at p = m = 4 and 165 ms at m = 8, on top of the check and the figure."""
    from mtb_helpers.pp.check import INTERLEAVED_CHUNKS, check_pipeline, simulated_for
    from mtb_helpers.pp.measured_plots import gap, measured_vs_simulated_png

    schedule_box = menu("schedule", SCHEDULES, name)
    stages_box = world_size_slider(stages, "stages p")
    micro_box = widgets.IntSlider(value=microbatches, min=1, max=16,
                                  description="micro-batches m", **SLIDER)
    recompute_box = widgets.Dropdown(options=[("off", False), ("on", True)], value=False,
                                     description="recompute")
    hop: dict[int, float] = {}   # stages -> the hop α measured before the first run with that many

    def render() -> list:
        s, p, m, rc = schedule_box.value, stages_box.value, micro_box.value, recompute_box.value
        # interleaved splits a stage's op into its chunks; each chunk's op keeps the op time (at
        # half of it a chunk's op is mostly its messages on a shared CPU, 12-34 % over)
        v = INTERLEAVED_CHUNKS if s == "interleaved" else 1
        times = tuple(x * v for x in op_time)
        schedule(s, p, m, v)   # a setting the schedule refuses: its ValueError before any rank starts
        if p not in hop:   # the prediction's α, measured before the run it predicts
            hop[p] = measure_hop_latency(p, op_time)
        alpha = hop[p]
        sim = simulated_for(s, p, m, v, times, rc, latency=alpha)   # the prediction, then the run
        report = check_pipeline(s, p, m, op_time=times, recompute=rc)
        pipe, measured = report.extra["pipeline"], report.result.measured()
        fig = measured_vs_simulated_png(measured, sim, s, width=9.5, latency=alpha)
        rows = []
        for quantity, got, want, fmt in (("makespan", measured.makespan, sim.makespan, "{:.3f} s"),
                                         ("bubble", measured.bubble_fraction, sim.bubble_fraction,
                                          "{:.3f}")):
            value, unit, allowed, within = gap(quantity, got, want)
            rows.append(f"{quantity} measured {fmt.format(got)}, predicted {fmt.format(want)}: "
                        f"{value:+.1f} {unit} (allowed {allowed:g} {unit}: "
                        f"{'within' if within else 'OUTSIDE'})")
        text = (f"check against one process: {'PASSED' if report.passed else 'FAILED'}; ops "
                f"executed = schedule(): {pipe['ops_match_schedule']}\n" + "\n".join(rows) + "\n"
                f"predicted: simulate() with F = {times[0] * 1e3:g} ms, B = {times[1] * 1e3:g} ms "
                + (f"per stage ({op_time[0] * 1e3:g} and {op_time[1] * 1e3:g} ms per chunk) "
                   if times != op_time else "") +
                f"and each message between ranks {alpha * 1e3:.2f} ms (the hop α measured before the "
                f"first run on {p} ranks)\n"
                f"peak stashed {pipe['peak_stashed']} (simulator {pipe['simulated_peak_activations']}); "
                f"bytes held {pipe['stash_bytes']}")
        return [fig, text]

    return live_view([[schedule_box, stages_box], [micro_box, recompute_box]], render)
