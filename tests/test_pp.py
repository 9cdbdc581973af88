"""Pipeline schedules and their simulator: orders derived by hand, bubbles against the papers'
closed forms, peaks, refusals; the figures and the explorer draw what the simulator says."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from mtb_helpers.pp.schedules import Op, closed_form, schedule, simulate, warmup_count  # noqa: E402


def order(name, p, m, chunks=None):
    ops = schedule(name, p, m, chunks)
    return [" ".join(op.label(ops.chunks > 1) for op in stage) for stage in ops]


# ---- orders, derived by hand from each paper's / Megatron-LM's rule -------------------------

def test_gpipe_runs_all_forwards_then_backwards_in_microbatch_order():
    assert order("gpipe", 2, 3) == ["F0 F1 F2 B0 B1 B2"] * 2


def test_1f1b_warmup_then_alternation_then_cooldown():
    # stage r: min(p-r-1, m) warm-up forwards, then F/B pairs, then the remaining backwards
    assert order("1f1b", 3, 4) == [
        "F0 F1 F2 B0 F3 B1 B2 B3",
        "F0 F1 B0 F2 B1 F3 B2 B3",
        "F0 B0 F1 B1 F2 B2 F3 B3",
    ]


def test_1f1b_with_fewer_microbatches_than_stages_caps_the_warmup_at_m():
    assert order("1f1b", 4, 2) == ["F0 F1 B0 B1", "F0 F1 B0 B1", "F0 F1 B0 B1", "F0 B0 F1 B1"]


def test_interleaved_follows_megatron_order():
    # p=2, v=2, m=4. Forward chunk-op k: group k // (p v), p micro-batches per chunk in a group;
    # backwards walk the chunks in reverse. Warm-up 2(p-r-1) + (v-1)p = 4 on rank 0, 2 on rank 1.
    assert order("interleaved", 2, 4, 2) == [
        "F0c0 F1c0 F0c1 F1c1 "
        "F2c0 B0c1 F3c0 B1c1 F2c1 B0c0 F3c1 B1c0 "
        "B2c1 B3c1 B2c0 B3c0",
        "F0c0 F1c0 "
        "F0c1 B0c1 F1c1 B1c1 F2c0 B0c0 F3c0 B1c0 F2c1 B2c1 F3c1 B3c1 "
        "B2c0 B3c0",
    ]


def test_zb_h1_defers_r_weight_grads_on_stage_r():
    # 1F1B's warm-up with B -> I; stage r keeps r W's waiting and flushes them at the end
    assert order("zb-h1", 3, 4) == [
        "F0 F1 F2 I0 W0 F3 I1 W1 I2 W2 I3 W3",
        "F0 F1 I0 F2 I1 W0 F3 I2 W1 I3 W2 W3",
        "F0 I0 F1 I1 F2 I2 W0 F3 I3 W1 W2 W3",
    ]


@pytest.mark.parametrize("name,kinds", [("gpipe", "FB"), ("1f1b", "FB"), ("interleaved", "FB"),
                                        ("zb-h1", "FIW")])
@pytest.mark.parametrize("p,m", [(1, 1), (2, 4), (3, 6), (4, 8), (4, 12)])
def test_every_stage_runs_every_op_exactly_once(name, kinds, p, m):
    ops = schedule(name, p, m)
    expected = sorted((k, i, c) for k in kinds for i in range(m) for c in range(ops.chunks))
    for stage in ops:
        assert sorted((op.kind, op.microbatch, op.chunk) for op in stage) == expected


@pytest.mark.parametrize("name, p, m", [
    (name, p, m) for name in ("1f1b", "zb-h1", "interleaved")
    for p, m in [(2, 2), (2, 6), (4, 4), (4, 8), (5, 15), (3, 1), (6, 2)]
    if name != "interleaved" or m % p == 0])   # interleaved needs m divisible by p (refused else)
def test_forwards_before_the_first_backward_match_the_warmup_count(name, p, m):
    ops = schedule(name, p, m)
    for r, stage in enumerate(ops):
        leading = next(i for i, op in enumerate(stage) if op.kind != "F")
        total = ops.chunks * m
        warm = warmup_count(name, p, m, r, ops.chunks)
        assert leading == min(warm + 1, total)  # the steady state opens with one more forward
    if name == "1f1b":
        assert [warmup_count(name, p, m, r) for r in range(p)] == [min(p - r - 1, m)
                                                                   for r in range(p)]


# ---- simulated bubble against the closed forms ---------------------------------------------

TIMES = [(1.0, 2.0), (1.0, 1.0), (2.0, 3.0), (0.5, 4.0)]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1(name):
    for p in range(1, 7):
        for m in range(1, 13):
            for f, b in TIMES:
                t = simulate(schedule(name, p, m), forward=f, backward=b)
                assert t.makespan == pytest.approx((m + p - 1) * (f + b))
                assert t.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))
                assert t.bubble_ratio == pytest.approx((p - 1) / m)


def test_interleaved_bubble_is_divided_by_the_chunk_count():
    for p in range(1, 7):
        for v in (2, 3, 4):
            for m in range(p, 4 * p + 1, p):
                for f, b in TIMES:
                    t = simulate(schedule("interleaved", p, m, v), forward=f, backward=b)
                    assert t.bubble_ratio == pytest.approx((p - 1) / (v * m))
                    assert t.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1))
                    assert t.makespan == pytest.approx((m + (p - 1) / v) * (f + b))


def test_zb_h1_idle_is_p_minus_1_times_f_plus_i_minus_w_in_its_regime():
    regime = outside = 0
    for p in range(1, 7):
        for m in range(1, 13):
            for f, i, w in [(1, 1, 1), (1, 2, 1), (2, 1, 0.5), (1, 0.5, 1), (0.5, 1, 1), (1, 1, 2)]:
                t = simulate(schedule("zb-h1", p, m), forward=f, input=i, weight=w)
                ref = closed_form("zb-h1", p, m, forward=f, input=i, weight=w)
                if m >= p and w <= min(f, i):
                    regime += 1
                    assert ref["exact"]
                    assert t.idle == pytest.approx([(p - 1) * (f + i - w)] * p)
                    assert t.bubble_fraction == pytest.approx(ref["bubble_fraction"])
                else:  # a W that does not fit in a gap pushes the next op: never better
                    outside += 1
                    assert not ref["exact"]
                    assert t.bubble_fraction >= ref["bubble_fraction"] - 1e-12
    assert regime and outside


def test_zb_h1_cuts_the_1f1b_bubble_to_a_third_when_f_i_w_are_equal():
    p, m = 4, 8
    onefb = simulate(schedule("1f1b", p, m), forward=1, backward=2)
    zb = simulate(schedule("zb-h1", p, m), forward=1, input=1, weight=1)
    assert sum(zb.idle) == pytest.approx(sum(onefb.idle) / 3)


def test_latency_adds_one_hop_per_stage_each_way():
    p, m, f, b, lat = 4, 6, 1.0, 2.0, 0.25
    t = simulate(schedule("gpipe", p, m), f, b, latency=lat)
    assert t.makespan == pytest.approx((m + p - 1) * (f + b) + 2 * (p - 1) * lat)
    # one stage has no neighbour: latency changes nothing
    assert simulate(schedule("1f1b", 1, m), f, b, latency=lat).makespan == pytest.approx(m * (f + b))


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved", "zb-h1"])
def test_events_respect_rank_order_and_dependencies(name):
    p, m = 4, 8
    t = simulate(schedule(name, p, m), forward=1.0, backward=2.0, latency=0.1)
    end = {}
    for r, evs in enumerate(t.events):
        for a, b in zip(evs, evs[1:]):
            assert b.start >= a.end - 1e-12  # a rank runs one op at a time, in order
        for e in evs:
            end[(e.op.kind, e.op.microbatch, e.op.chunk * p + r)] = e.end
    last = t.chunks * p - 1
    grad = "I" if name == "zb-h1" else "B"
    for r, evs in enumerate(t.events):
        for e in evs:
            s = e.op.chunk * p + r
            if e.op.kind == "F" and s > 0:
                assert e.start >= end[("F", e.op.microbatch, s - 1)] + 0.1 - 1e-12
            if e.op.kind in "BI" and s < last:
                assert e.start >= end[(grad, e.op.microbatch, s + 1)] + 0.1 - 1e-12
            if e.op.kind == "W":
                assert e.start >= end[("I", e.op.microbatch, s)]
        assert sum(hi - lo for lo, hi in t.idle_intervals(r)) == pytest.approx(t.idle[r])


# ---- activation memory ---------------------------------------------------------------------

@pytest.mark.parametrize("p,m", [(4, 8), (4, 2), (3, 3), (1, 5), (6, 12)])
def test_peak_activations(p, m):
    assert simulate(schedule("gpipe", p, m)).peak_activations == [m] * p
    # 1F1B: the point of the schedule, at most p - r micro-batches in flight on stage r
    assert simulate(schedule("1f1b", p, m)).peak_activations == [min(p - r, m) for r in range(p)]
    # ZB-H1 holds activations until W: every stage reaches 1F1B's worst case p, never more
    assert simulate(schedule("zb-h1", p, m)).peak_activations == [min(p, m)] * p


def test_interleaved_peak_counts_chunk_activations():
    p, m, v = 4, 8, 2
    t = simulate(schedule("interleaved", p, m, v))
    assert t.peak_activations == [min(2 * (p - r - 1) + (v - 1) * p + 1, v * m) for r in range(p)]
    # in whole-stage units stage 0 holds p + (p-1)/v: interleaving costs memory on the first stage
    assert t.peak_memory[0] == pytest.approx(p + (p - 1) / v)


# ---- refusals ------------------------------------------------------------------------------

@pytest.mark.parametrize("args,kwargs,match", [
    (("pipedream", 4, 8), {}, "unknown schedule"),
    (("1f1b", 0, 8), {}, "stages"),
    (("1f1b", 4, -1), {}, "microbatches"),
    (("1f1b", 4.0, 8), {}, "stages"),
    (("gpipe", 4, True), {}, "microbatches"),
    (("interleaved", 4, 6), {}, "divisible"),
    (("interleaved", 4, 8), {"chunks": 1}, "chunks >= 2"),
    (("interleaved", 4, 8), {"chunks": 0}, "chunks"),
    (("1f1b", 4, 8), {"chunks": 2}, "only applies to the interleaved"),
])
def test_bad_schedule_arguments_raise_value_error_with_reason(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        schedule(*args, **kwargs)


def test_simulate_refuses_negative_times_and_unknown_kinds():
    ops = schedule("1f1b", 2, 2)
    with pytest.raises(ValueError, match="forward"):
        simulate(ops, forward=-1.0)
    with pytest.raises(ValueError, match="latency"):
        simulate(ops, latency=-0.1)
    with pytest.raises(ValueError, match="unknown op kinds"):
        simulate([[Op("X", 0)]])


def test_simulate_names_the_stuck_ops_of_a_deadlocking_schedule():
    # stage 0 wants B0 before F0: B0 needs stage 1's B0, which needs F0 from stage 0
    ops = [[Op("B", 0), Op("F", 0)], [Op("F", 0), Op("B", 0)]]
    with pytest.raises(ValueError, match="deadlock.*stage 0 at B0"):
        simulate(ops)


def test_simulate_refuses_an_op_run_twice():
    with pytest.raises(ValueError, match="twice"):
        simulate([[Op("F", 0), Op("F", 0), Op("B", 0)]])


# ---- figures and explorer ------------------------------------------------------------------

def test_gantt_draws_one_box_per_op_hatches_idle_and_titles_the_bubble():
    from mtb_helpers.pp.plots import IDLE_HATCH, OP_COLORS, plot_gantt
    from matplotlib.colors import to_rgba
    t = simulate(schedule("1f1b", 3, 4))
    fig = plot_gantt(t, "1f1b")
    ax = fig.axes[0]
    faces = [tuple(face) for face in ax.collections[0].get_facecolors()]   # the ops' boxes
    assert sum(f == to_rgba(OP_COLORS["F"]) for f in faces) == 3 * 4
    assert sum(f == to_rgba(OP_COLORS["B"]) for f in faces) == 3 * 4
    assert len(faces) == 3 * 4 * 2 and len(ax.collections[1].get_paths()) == 3 * 4 * 2   # labels
    hatched = [patch for patch in ax.patches if patch.get_hatch() == IDLE_HATCH]
    assert len(hatched) == sum(len(t.idle_intervals(r)) for r in range(3))
    assert f"{t.bubble_fraction:.1%}" in ax.get_title()
    plt.close(fig)


def test_interleaved_rows_name_ranks_not_stages():
    from mtb_helpers.pp.plots import plot_gantt
    # rank r of an interleaved schedule holds virtual stages r, p + r, ...: a row labelled
    # "stage r" would contradict the chunk labels c0, c1 in it
    ops = schedule("interleaved", 4, 8, chunks=2)
    assert [line.split(":")[0] for line in ops.table().splitlines()] == [f"rank {r}" for r in range(4)]
    assert schedule("1f1b", 4, 8).table().startswith("stage 0: F0")
    fig = plot_gantt(simulate(ops), "interleaved")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"rank {r}" for r in (3, 2, 1, 0)]
    assert ax.get_ylabel().startswith("rank")
    plt.close(fig)


def test_bubble_and_memory_figures_plot_the_simulated_numbers():
    from mtb_helpers.pp.plots import plot_bubble_vs_microbatches, plot_peak_memory
    fig = plot_bubble_vs_microbatches(stage_counts=(2, 4), max_microbatches=6)
    dots = [line for line in fig.axes[0].lines if line.get_marker() == "o"]
    assert list(dots[1].get_ydata()) == pytest.approx([3 / (m + 3) for m in range(1, 7)])
    plt.close(fig)
    fig = plot_peak_memory(stages=3, microbatches=6, chunks=2)
    heights = sorted(round(b.get_height(), 6) for b in fig.axes[0].patches if b.get_width() < 1)
    assert heights.count(6.0) == 3  # GPipe holds all m on every stage
    plt.close(fig)


def test_explorer_numbers_and_refusal():
    from mtb_helpers.pp.widget import explore_pipeline, pipeline_numbers
    text, t = pipeline_numbers("gpipe", 4, 8, ratio=2.0)
    assert "simulated 0.273, closed form 0.273" in text
    assert t.makespan == pytest.approx(33)
    with pytest.raises(ValueError, match="divisible"):
        pipeline_numbers("interleaved", 4, 6)
    w = explore_pipeline("interleaved", 4, 6)  # refused setting: shows the reason, no traceback
    assert sum(len(row.children) for row in w.children[:-1]) == 5  # 5 controls, then the output
    [shown] = w.children[-1].children
    assert "cannot simulate" in shown.value and "divisible" in shown.value
    plt.close("all")
