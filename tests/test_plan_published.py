"""The planner against Narayanan et al. 2021 (SC), Table 1: each published layout is one the
planner accepts and fits in 80 GiB, its FLOPs per step are the paper's 96 B s l h^2 (1 + s/(6h)
+ V/(16 l h)), tensor parallelism stays inside a node, and rows that contradict themselves or the
paper's rules (tp and pp swapped, GPUs that are not tp*pp*dp, ...) are refused. Throughput gaps
are a benchmark (benchmarks/plan_published.py), not a test. Arithmetic only: ``no_ranks`` fails
any test that starts a rank.
"""
from __future__ import annotations

import pytest

from mtb_helpers.plan import GIB, cluster, layout_problems, memory_per_rank, total_params
from mtb_helpers.plan.published import (A100_MATMUL_EFFICIENCY, NARAYANAN_2021_TABLE_1, compare,
                                        gpt_model, narayanan_flops, published_layout, row_problems,
                                        step_flops)

ROWS = NARAYANAN_2021_TABLE_1
IDS = [r.name for r in ROWS]
BIG = {"310B", "530B", "1T"}       # plan() over 1920-3072 GPUs takes 10-25 s each


def by_name(name):
    return next(r for r in ROWS if r.name == name)


def test_the_table_is_the_papers_ten_rows(no_ranks):
    assert IDS == ["1.7B", "3.6B", "7.5B", "18B", "39B", "76B", "145B", "310B", "530B", "1T"]
    assert [r.tflops_per_gpu for r in ROWS] == [137, 138, 142, 135, 138, 140, 148, 155, 163, 163]
    one_t = by_name("1T")      # the abstract: 502 petaFLOP/s on 3072 GPUs, 52 % of peak
    assert (one_t.gpus, one_t.aggregate_pflops, one_t.percent_of_peak) == (3072, 502.0, 52)


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_every_row_is_consistent(row, no_ranks):
    assert row_problems(row) == []
    assert round(total_params(gpt_model(row)) / 1e9, 1) == row.params_billion


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_published_layout_is_valid_and_fits_in_80_gib(row, no_ranks):
    gpt, a100, layout = gpt_model(row), cluster("a100", gpus=row.gpus), published_layout(row)
    assert layout_problems(gpt, a100, layout, row.batch) == []
    assert layout.world_size == row.gpus and layout.global_batch == row.batch
    assert (layout.tp, layout.pp, layout.dp) == (row.tp, row.pp, row.gpus // (row.tp * row.pp))
    assert layout.recompute == "full" and layout.zero_stage == 0 and not layout.sequence_parallel
    assert max(s.total for s in memory_per_rank(gpt, layout)) <= 80 * GIB == a100.memory_bytes


def test_schedules_are_the_scripts(no_ranks):
    """--num-layers-per-virtual-pipeline-stage 5, 5, 3, 1 for 76B, 145B, 310B, 530B: 15/5, 10/5,
    6/3, 3/1 layers per stage make 3, 2, 2, 3 chunks; every other row runs 1F1B."""
    chunks = {r.name: published_layout(r).chunks for r in ROWS}
    assert chunks == {"1.7B": 1, "3.6B": 1, "7.5B": 1, "18B": 1, "39B": 1, "76B": 3, "145B": 2,
                      "310B": 2, "530B": 3, "1T": 1}
    assert {r.name for r in ROWS if published_layout(r).schedule == "interleaved"} \
        == {"76B", "145B", "310B", "530B"}


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_step_flops_are_narayanans_formula(row, no_ranks):
    layout = published_layout(row)
    want = narayanan_flops(row.batch, 2048, row.layers, row.hidden, 51200)
    assert step_flops(gpt_model(row), layout) == pytest.approx(want, rel=1e-12)
    # the check can fail: without recompute the planner counts 72 B s l h^2 (...), not 96
    no_rc = step_flops(gpt_model(row), layout.with_(recompute="none"))
    assert no_rc != pytest.approx(want, rel=1e-3)
    h, l = row.hidden, row.layers
    assert no_rc == pytest.approx(72 * row.batch * 2048 * l * h * h
                                  * (1 + 2048 / (6 * h) + 51200 / (12 * l * h)), rel=1e-12)


def test_tensor_parallelism_stays_in_a_node(no_ranks):
    for r in ROWS:
        assert r.tp <= 8 and (r.pp == 1 or r.tp == 8), r.name


@pytest.mark.parametrize("row", [r if r.name not in BIG else pytest.param(r, marks=pytest.mark.slow)
                                 for r in ROWS], ids=IDS)
def test_the_planners_best_layout_keeps_tp_in_a_node(row, no_ranks):
    c = compare(row)
    assert c.best is not None and c.best.tp <= 8
    assert all(cand.layout.tp <= 8 for cand in c.plan_result.ranked)
    assert any("exceeds 8 GPUs per node" in why[0] for _, why in c.plan_result.rejected)
    assert 1 <= c.rank <= c.of + 1 and 1 <= c.rank_2021 <= c.of_2021 + 1
    assert c.best_speedup >= 1 or c.rank == 1


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_prediction_uses_one_stated_efficiency(row, no_ranks):
    """Nothing per row: the prediction cannot beat the assumed matmul rate, it is the planner's
    FLOPs over its step time, and a lower efficiency predicts proportionally less compute."""
    c = compare(row, rank=False)
    assert c.efficiency == A100_MATMUL_EFFICIENCY == 271.2 / 312
    assert 0 < c.predicted_tflops <= A100_MATMUL_EFFICIENCY * 312 + 1e-9
    assert c.predicted_tflops == pytest.approx(step_flops(c.model, c.layout) / c.time.step
                                               / row.gpus / 1e12, rel=1e-12)
    assert c.gap == pytest.approx(c.predicted_tflops / row.tflops_per_gpu - 1, rel=1e-12)
    half = compare(row, efficiency=A100_MATMUL_EFFICIENCY / 2, rank=False)
    assert half.time.terms["compute"] == pytest.approx(2 * c.time.terms["compute"], rel=1e-12)
    assert c.fits and c.peak_bytes <= 80 * GIB


# ---- deliberate mistakes the comparison must catch -------------------------------------------------

@pytest.mark.parametrize("row", [r for r in ROWS if r.tp != r.pp], ids=lambda r: r.name)
def test_tp_and_pp_swapped_are_refused(row, no_ranks):
    swapped = row.with_(tp=row.pp, pp=row.tp)
    assert any("takeaway #1" in p for p in row_problems(swapped))
    with pytest.raises(ValueError, match="takeaway #1"):
        compare(swapped, rank=False)


@pytest.mark.parametrize("name,gpus", [("39B", 500), ("1T", 3000), ("3.6B", 65)])
def test_gpus_that_are_not_tp_pp_dp_are_refused(name, gpus, no_ranks):
    bad = by_name(name).with_(gpus=gpus)
    assert any("is not tp*pp*dp" in p for p in row_problems(bad))
    with pytest.raises(ValueError, match="not a multiple of tp\\*pp"):
        published_layout(bad)
    with pytest.raises(ValueError, match="is not tp\\*pp\\*dp"):
        compare(bad, rank=False)


@pytest.mark.parametrize("change,match", [
    (dict(hidden=12288 + 1024, heads=104), "parameters"),          # sizes of another model
    (dict(layers=96), "parameters"),
    (dict(tflops_per_gpu=136), "PFLOP/s"),                       # a mistyped per-GPU figure
    (dict(aggregate_pflops=272.1), "PFLOP/s"),
    (dict(percent_of_peak=57), "% of 312"),
    (dict(tp=16, pp=4), "exceeds 8 GPUs per node"),
])
def test_inconsistent_rows_are_refused(change, match, no_ranks):
    bad = by_name("145B").with_(**change)
    assert any(match in p for p in row_problems(bad))
    with pytest.raises(ValueError, match=match):
        compare(bad, rank=False)


def test_layouts_that_do_not_divide_are_refused(no_ranks):
    with pytest.raises(ValueError, match="batch 2300 is not a multiple of dp\\*microbatch"):
        published_layout(by_name("145B").with_(batch=2300))
    with pytest.raises(ValueError, match="virtual stages of 4 layers"):
        published_layout(by_name("145B").with_(layers_per_virtual_stage=4))


@pytest.mark.parametrize("change,match", [(dict(tp=0), "tp"), (dict(microbatch=1.5), "microbatch"),
                                          (dict(ddp="nccl"), "ddp"),
                                          (dict(layers_per_virtual_stage=0), "virtual")])
def test_bad_row_input_is_refused(change, match, no_ranks):
    with pytest.raises(ValueError, match=match):
        by_name("1.7B").with_(**change)
