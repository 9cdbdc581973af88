"""Overlap made visible and predicted: the two-lane α-β model against hand-worked cases, the
measurement under an emulated link (its structure, not its timings), mixed precision's bytes and
errors, the figures and ``minitrainbench dp overlap``."""
from __future__ import annotations

import json
import subprocess
import sys

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from mtb_helpers.cost import Link
from mtb_helpers.dp.overlap import assign_buckets
from mtb_helpers.dp.overlap_model import LaneOp, predict_ddp, predict_fsdp, simulate
from mtb_helpers.dp.overlap_plots import (plot_bucket_curve, plot_lanes, plot_precision_errors,
                                          plot_step_times)

LINK = Link(1e-3, 1e6)          # 1 ms per message, 1 MB/s: easy numbers
AR = lambda n, p=2: 2 * (p - 1) * 1e-3 + 2 * (p - 1) / p * n / 1e6   # ring all-reduce


def test_simulate_runs_compute_and_comm_on_their_own_lanes():
    pred = simulate([LaneOp("compute", "a", 2.0), LaneOp("comm", "x", 3.0), LaneOp("compute", "b", 1.0),
                     LaneOp("comm", "y", 1.0, ("x",)), LaneOp("compute", "c", 1.0, ("y",))])
    ends = {e[1]: e[3] for e in pred.events}
    assert ends == {"a": 2.0, "x": 5.0, "b": 3.0, "y": 6.0, "c": 7.0}
    assert (pred.step, pred.compute, pred.comm, pred.exposed) == (7.0, 4.0, 4.0, 3.0)


def test_byte_counts_bucket_as_tensors_of_one_dtype_do():
    sizes = [400, 40, 4000, 400, 40, 40]
    for cap in (0, 100, 440, 1000, 5000, 1e9):
        named = [(str(i), torch.zeros(n // 4)) for i, n in enumerate(sizes)]
        assert assign_buckets(list(enumerate(sizes)), cap) == assign_buckets(named, cap)


def test_without_overlap_the_step_is_the_sum_of_everything():
    layers = [[1000, 100]] * 4
    for cap_mb, buckets in ((25.0, [4400]), (1100 / 2 ** 20, [1100] * 4)):
        pred = predict_ddp(layers, 0.5e-3, 2e-3, LINK, 2, cap_mb, overlap=False, t_opt=1e-3)
        assert pred.step == pytest.approx(4 * 2.5e-3 + sum(AR(n) for n in buckets) + 1e-3)


def test_with_overlap_only_the_last_bucket_is_exposed_when_each_fits_under_a_backward():
    layers = [[1000, 100]] * 4                       # a bucket per layer: AR(1100) = 3.1 ms
    pred = predict_ddp(layers, 0.5e-3, 4e-3, LINK, 2, 1100 / 2 ** 20, overlap=True)
    assert pred.step == pytest.approx(4 * 4.5e-3 + AR(1100))     # max(compute, comm) + the tail
    one = predict_ddp(layers, 0.5e-3, 4e-3, LINK, 2, 25.0, overlap=True)
    assert one.step == pytest.approx(4 * 4.5e-3 + AR(4400))      # one bucket hides nothing


def test_when_communication_is_longer_it_sets_the_step():
    layers = [[1000, 100]] * 4
    pred = predict_ddp(layers, 0.5e-3, 1e-3, LINK, 2, 1100 / 2 ** 20, overlap=True)
    # the first bucket starts after the first backward, then the comm lane never rests
    assert pred.step == pytest.approx(4 * 0.5e-3 + 1e-3 + 4 * AR(1100))


def test_zero1_steps_its_largest_partition_and_adds_one_all_gather():
    """``t_opt`` is the whole model's optimizer time; ZeRO-1's slowest rank steps the largest
    partition, its share of the bytes (3000 of 4400 here, not 1/p: whole parameters are assigned)."""
    layers = [[1000, 100]] * 4
    plain = predict_ddp(layers, 0.5e-3, 4e-3, LINK, 2, 25.0, t_opt=2e-3)
    zero1 = predict_ddp(layers, 0.5e-3, 4e-3, LINK, 2, 25.0, t_opt=2e-3, zero1=True,
                        largest_partition_bytes=3000)
    optimizer = [e for e in zero1.events if e[1] == "optimizer"][0]
    assert optimizer[3] - optimizer[2] == pytest.approx(2e-3 * 3000 / 4400)
    gather = 1e-3 + 0.5 * 6000 / 1e6                 # all-gather of S = 2 x 3000 B on 2 ranks
    assert zero1.step == pytest.approx(plain.step - 2e-3 + 2e-3 * 3000 / 4400 + gather)
    with pytest.raises(ValueError, match="largest_partition_bytes"):   # no partition: no share
        predict_ddp(layers, 0.5e-3, 4e-3, LINK, 2, 25.0, t_opt=2e-3, zero1=True)


def test_fsdp_prefetch_hides_the_gathers_behind_compute():
    g = 1e-3 + 0.5 * 2000 / 1e6                     # all-gather of a 2000 B unit: 2 ms
    rs = g                                          # its reduce-scatter costs the same
    no = predict_fsdp([2000] * 3, 3e-3, 6e-3, LINK, 2, prefetch=False)
    yes = predict_fsdp([2000] * 3, 3e-3, 6e-3, LINK, 2, prefetch=True)
    # no prefetch: every gather waits in front of its compute; in the backward a gather also
    # queues behind the previous unit's reduce-scatter
    assert no.step == pytest.approx(3 * (g + 3e-3) + g + 6e-3 + 2 * (rs + g + 6e-3) + rs)
    # prefetch (gathers shorter than compute): only the first gather of each pass and the last
    # reduce-scatter are exposed
    assert yes.step == pytest.approx(g + 3 * 3e-3 + g + 3 * 6e-3 + rs)
    assert yes.step < no.step


def _overlap_events():
    from mtb_helpers.dp.overlap_time import measure_ddp
    return measure_ddp(world_size=2, bucket_cap_mb=0.25, overlap=True, steps=1, layers=4,
                       hidden=256, time_scale=10.0)


def test_under_a_link_buckets_reduce_while_the_backward_still_runs():
    res = _overlap_events()
    assert res["label"].startswith("emulated link")
    for events in res["events"]:
        backward = [e for e in events if e[0] == "compute" and e[1].endswith("bwd")]
        reduces = [e for e in events if e[1] == "all_reduce"]
        assert len(backward) == 4 and len(reduces) == 4   # one bucket per layer
        assert reduces[0][2] < backward[-1][3]            # a bucket was reducing before the end
    assert res["predicted"] > 0 and res["measured"] > 0


def test_zero1s_predicted_optimizer_is_the_one_its_slowest_rank_runs():
    """The prediction ``measure_ddp`` prints next to its measurement times the optimizer exactly
    as the ranks pad it (once divided, by the partition's share): not halved a second time."""
    from mtb_helpers.dp.overlap_time import measure_ddp
    res = measure_ddp(world_size=2, bucket_cap_mb=25.0, zero1=True, steps=1, layers=3, hidden=64,
                      t_opt=8e-3, time_scale=5.0)
    predicted = [e[3] - e[2] for e in res["prediction"].events if e[1] == "optimizer"]
    ran = max(e[3] - e[2] for events in res["events"] for e in events if e[1] == "optimizer")
    assert len(predicted) == 1
    # padding never runs short; on a busy machine it may run a little long
    assert 0.8 * ran <= predicted[0] <= ran * 1.001, (predicted, ran)


def test_mixed_precision_halves_the_gathered_bytes_and_stays_close_to_fp32():
    from mtb_helpers.dp.overlap_precision import mixed_precision
    res = mixed_precision(world_size=2, compute_dtypes=(torch.bfloat16, torch.float16))
    b = res["bytes"]
    assert b["bfloat16"]["all_gather"] * 2 == b["float32"]["all_gather"] == b["float16"]["all_gather"] * 2
    assert b["bfloat16"]["reduce_scatter"] == b["float32"]["reduce_scatter"]   # reduced in fp32
    assert len(res["names"]) == 6 and res["names"][0] == "0.weight"
    assert 0 < max(res["errors"]["float16"]) < max(res["errors"]["bfloat16"]) < 0.05


def test_the_figures_have_titles_labels_and_legends():
    ev = [("compute", "layer 0 bwd", 0.0, 2e-3, 0), ("comm", "all_reduce", 1e-3, 4e-3, 100)]
    figs = [plot_lanes([ev, ev], "emulated link: one backward", predicted=ev),
            plot_step_times(["a", "b"], [1e-3, 2e-3], [1.1e-3, 2.2e-3], "emulated link: steps"),
            plot_bucket_curve([0, 0.1, 1], [3e-3, 2e-3, 2.5e-3], [3.1e-3, 2.1e-3, 2.6e-3], 3e-3,
                              "emulated link: buckets"),
            plot_precision_errors(["w", "b"], {"bfloat16": [1e-3, 1e-4]}, "mixed precision")]
    for fig in figs:
        ax = fig.axes[0]
        assert ax.get_title() and ax.get_xlabel() is not None and ax.get_legend() is not None
    assert figs[0].axes[0].get_yticklabels()[0].get_text() == "predicted compute"   # the top row


def test_the_lanes_tell_the_collectives_apart_so_that_queueing_shows():
    """FSDP's backward queues a reduce-scatter behind the next all-gather on one link: each
    collective gets its own hatch, its own legend entry and a label where the box is wide."""
    ev = [("comm", "all-gather 1 bwd", 0.0, 3e-3, 100), ("compute", "backward 1", 3e-3, 6e-3, 0),
          ("comm", "reduce-scatter 1", 6e-3, 9e-3, 100), ("comm", "all_gather_single", 9e-3, 12e-3, 50)]
    ax = plot_lanes([ev], "emulated link: FSDP backward", predicted=ev).axes[0]
    comm = [c for c in ax.patches if c.get_hatch()]
    assert {c.get_hatch() for c in comm} == {"////", "\\\\\\\\"}   # all-gather, reduce-scatter
    assert [c.get_hatch() for c in comm[:3]] == ["////", "\\\\\\\\", "////"]  # the ranks' name too
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("all-gather (AG)" in t for t in legend) and any("reduce-scatter (RS)" in t for t in legend)
    assert not any("all-reduce" in t for t in legend)            # only what the figure draws
    assert {"AG", "RS", "B1"} <= {t.get_text() for t in ax.texts}


def test_the_bucket_curve_puts_each_cap_at_its_value():
    """0, 0.25, 0.5, 1 and 2 MiB are not evenly spaced: the axis must not draw them so."""
    caps = [0.0, 0.25, 0.5, 1.0, 2.0]
    ax = plot_bucket_curve(caps, [5e-3, 3e-3, 2e-3, 2.5e-3, 3e-3], None, 3e-3, "emulated link: buckets",
                           buckets=[16, 8, 4, 2, 1]).axes[0]
    assert list(ax.lines[0].get_xdata()) == caps
    assert list(ax.get_xticks()) == caps


def test_the_command_refuses_bad_input_with_exit_2():
    out = subprocess.run([sys.executable, "-m", "mtb_helpers.cli", "dp", "overlap", "--alpha", "-1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "alpha" in out.stderr


def test_the_command_checks_then_times_and_prints_json():
    out = subprocess.run([sys.executable, "-m", "mtb_helpers.cli", "dp", "overlap", "--layers", "2",
                          "--hidden", "64", "--steps", "1", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout)
    assert res["passed"] and res["checks"] == {"ddp": "PASS", "zero1": "PASS", "fsdp": "PASS"}
    assert [s["name"] for s in res["steps"]] == ["DDP, no overlap", "DDP, overlap", "ZeRO-1",
                                                 "FSDP, no prefetch", "FSDP, prefetch"]
    assert all(s["predicted"] > 0 and s["measured"] > 0 for s in res["steps"])


def test_the_saved_timings_of_notebook_14_say_what_its_text_says():
    """The text calls measured steps 'a little longer than predicted': every saved measurement is
    within -10 % and +50 % of its prediction, and the overlap step is shorter than the serial one."""
    import re
    from pathlib import Path

    import nbformat
    nb = nbformat.read(Path(__file__).parents[1] / "notebooks" / "14_hiding_communication.ipynb", 4)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []) if o.get("name") == "stdout")
    pairs = [(float(p), float(m)) for p, m in
             re.findall(r"predicted ([\d.]+) ms, measured ([\d.]+) ms", text)]
    assert len(pairs) >= 5
    assert all(-0.10 <= m / p - 1 <= 0.50 for p, m in pairs), pairs
    serial, overlapped = pairs[0][1], pairs[1][1]
    assert overlapped < serial


def test_each_saved_measurement_sits_beside_the_model_the_text_prints():
    """A timing cell's "predicted" is the same number the model's own cells print (notebook 14's
    ZeRO-1 measurement once carried a prediction whose optimizer time was divided by p twice)."""
    import re
    from pathlib import Path

    import nbformat
    nb = nbformat.read(Path(__file__).parents[1] / "notebooks" / "14_hiding_communication.ipynb", 4)

    def printed(cell):
        return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("name") == "stdout")
    model = "".join(printed(c) for c in nb.cells if c.cell_type == "code" and
                    {"out:ddp-predict", "out:zero1-predict", "out:fsdp-predict"} & set(c.metadata.get("tags", [])))
    timed = "".join(printed(c) for c in nb.cells if c.cell_type == "code" and "measure_" in c.source)
    predicted = re.findall(r"predicted ([\d.]+) ms, measured", timed)
    assert len(predicted) >= 5, timed
    assert all(re.search(rf"\b{re.escape(p)} ms", model) for p in predicted), (predicted, model)


def test_under_torchrun_the_command_runs_the_checks_only():
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node=2", "-m", "mtb_helpers.cli", "dp", "overlap", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == {"passed": True, "checks": {"ddp": "PASS", "zero1": "PASS",
                                                                 "fsdp": "PASS"}}
