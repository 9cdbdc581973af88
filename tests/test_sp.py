"""Sequence parallelism: the regions, position-keyed dropout, the block at 1..4 ranks, the
minimal demo, and the measured activation memory and bytes against the model."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from mtb_helpers import run
from mtb_helpers.sp.check import check_sequence_parallel
from mtb_helpers.comm.records import record
from mtb_helpers.comm.regions import (GATHER_SP, GRAD_ALLREDUCE_SP, REDUCE_SCATTER_SP, SCATTER_SP,
                                 allreduce_sequence_parallel_grad, gather_from_sequence_parallel_region,
                                 reduce_scatter_to_sequence_parallel_region,
                                 scatter_to_sequence_parallel_region)
from mtb_helpers.sp.layers import (PositionKeyedDropout, SequenceParallelMLPBlock, TensorParallelMLPBlock,
                            keep_mask, layernorm_dropout_on_shard, layernorm_dropout_reference,
                            position_keyed_dropout)
from mtb_helpers.sp.memory import (TERMS, activation_model, make_block_inputs, measure_activation_memory)

DTYPES = [torch.float32, torch.float64]


def _x(shape, r):
    return torch.arange(float(torch.Size(shape).numel())).reshape(shape) + 100 * r


def _region_job(name, in_shape, grad_shape, **kwargs):
    """Each rank sends its own x (values tagged by rank) through the region and back-propagates
    its own grad; returns (y, dx, record)."""
    import mtb_helpers.comm.regions as comm_sp

    def job():
        r = dist.get_rank() if dist.is_initialized() else 0
        x = _x(in_shape, r).requires_grad_(True)
        with record() as rec:
            y = getattr(comm_sp, name)(x, **kwargs)
            y.backward(_x(grad_shape, r) * -1)
        return y.detach(), x.grad, rec
    return job


@pytest.mark.parametrize("t", [1, 2, 3])
def test_scatter_splits_the_sequence_forward_and_all_gathers_backward(t):
    full, shard = (3 * t, 2, 2), (3, 2, 2)
    out = run(_region_job("scatter_to_sequence_parallel_region", full, shard), world_size=t)
    grads = torch.cat([-_x(shard, q) for q in range(t)])
    for r, (y, dx, rec) in enumerate(out):
        assert torch.equal(y, _x(full, r)[3 * r:3 * (r + 1)])
        assert torch.equal(dx, grads)
        assert [(e.op, e.region, e.direction) for e in rec] == [
            ("split", SCATTER_SP, "forward"), ("all_gather", SCATTER_SP, "backward")]


@pytest.mark.parametrize("t", [1, 2, 3])
def test_gather_all_gathers_the_sequence_forward_and_reduce_scatters_backward(t):
    shard, full = (2, 1, 3), (2 * t, 1, 3)
    out = run(_region_job("gather_from_sequence_parallel_region", shard, full), world_size=t)
    gathered = torch.cat([_x(shard, q) for q in range(t)])
    grad_sum = sum(-_x(full, q) for q in range(t))
    for r, (y, dx, rec) in enumerate(out):
        assert torch.equal(y, gathered)
        assert torch.equal(dx, grad_sum[2 * r:2 * (r + 1)])
        assert [(e.op, e.direction) for e in rec] == [("all_gather", "forward"),
                                                      ("reduce_scatter", "backward")]
        assert rec[0].region == GATHER_SP and rec[0].bytes == 6 * 4
        assert rec[0].sent_bytes == (t - 1) * 6 * 4 and rec[1].sent_bytes == (t - 1) * 6 * t * 4 // t


def test_gather_with_a_replicated_grad_only_splits_it_backward():
    shard, full = (2, 3), (4, 3)
    out = run(_region_job("gather_from_sequence_parallel_region", shard, full,
                          tensor_parallel_output_grad=False), world_size=2)
    for r, (_, dx, rec) in enumerate(out):
        assert torch.equal(dx, -_x(full, r)[2 * r:2 * (r + 1)])     # its own rows, not a sum
        assert [e.op for e in rec] == ["all_gather", "split"]


@pytest.mark.parametrize("t", [1, 2, 4])
def test_reduce_scatter_sums_and_splits_forward_and_all_gathers_backward(t):
    full, shard = (2 * t, 3), (2, 3)
    out = run(_region_job("reduce_scatter_to_sequence_parallel_region", full, shard), world_size=t)
    total = sum(_x(full, q) for q in range(t))
    grads = torch.cat([-_x(shard, q) for q in range(t)])
    for r, (y, dx, rec) in enumerate(out):
        assert torch.equal(y, total[2 * r:2 * (r + 1)])
        assert torch.equal(dx, grads)
        assert [(e.op, e.region, e.direction) for e in rec] == [
            ("reduce_scatter", REDUCE_SCATTER_SP, "forward"), ("all_gather", REDUCE_SCATTER_SP, "backward")]


def test_param_grad_region_is_identity_forward_and_sums_grads_backward():
    def job():
        r = dist.get_rank()
        p = nn.Parameter(torch.ones(4))
        with record() as rec:
            (allreduce_sequence_parallel_grad(p, "w") * (r + 1)).sum().backward()
        return p.grad, rec
    for grad, rec in run(job, world_size=3):
        assert torch.equal(grad, torch.full((4,), 6.0))              # 1 + 2 + 3
        (e,) = rec.events
        assert (e.op, e.region, e.operator, e.direction) == ("all_reduce", GRAD_ALLREDUCE_SP, "w", "backward")


def test_regions_without_ranks_are_identities():
    x = torch.randn(4, 2, requires_grad=True)
    for fn in (scatter_to_sequence_parallel_region, gather_from_sequence_parallel_region,
               reduce_scatter_to_sequence_parallel_region):
        assert torch.equal(fn(x), x)


def test_keep_mask_is_keyed_by_global_position_and_seed():
    full = keep_mask((12, 3, 5), 0.3, seed=7)
    for t in (2, 3, 4):
        n = 12 // t
        shards = [keep_mask((n, 3, 5), 0.3, seed=7, row_offset=r * n) for r in range(t)]
        assert torch.equal(torch.cat(shards), full)
    assert not torch.equal(keep_mask((12, 3, 5), 0.3, seed=8), full)
    assert not torch.equal(full[:6], full[6:])             # two halves of a sequence differ
    big = keep_mask((4096, 4, 8), 0.25, seed=0)
    assert abs(big.double().mean().item() - 0.75) < 0.01   # keeps 1 - p of the elements
    assert keep_mask((5, 5), 0.0, seed=3).all()
    x = torch.ones(12, 3, 5)
    y = position_keyed_dropout(x, 0.3, 7)
    assert torch.equal(y, full * (1 / 0.7))
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        PositionKeyedDropout(1.0)
    drop = PositionKeyedDropout(0.5, 0).eval()
    assert torch.equal(drop(x), x)                          # eval: no dropout


def _block_job(ln, fc1, fc2, x, dy, p, seed, save_input_shard=False):
    t, r = dist.get_world_size(), dist.get_rank()
    n = x.shape[0] // t
    block = SequenceParallelMLPBlock.from_full(ln, fc1, fc2, p, seed, save_input_shard=save_input_shard)
    x_r = x[r * n:(r + 1) * n].clone().requires_grad_(True)
    with record() as rec:
        y = block(x_r)
        y.backward(dy[r * n:(r + 1) * n])
    grads = {k: v.grad for k, v in block.named_parameters()}
    return y.detach(), x_r.grad, grads, rec


def _gathered(results):
    y = torch.cat([res[0] for res in results])
    dx = torch.cat([res[1] for res in results])
    ln_w = results[0][2]["ln.weight"]
    w1 = torch.cat([res[2]["fc1.weight"] for res in results])       # [ffn/t, h] row blocks
    w2 = torch.cat([res[2]["fc2.weight"] for res in results], dim=1)  # [h, ffn/t] column blocks
    return y, dx, ln_w, w1, w2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 2, 3, 4])
def test_block_matches_one_process(t, dtype):
    report = check_sequence_parallel(world_size=t, seq_len=12, batch=2, hidden=6, ffn_hidden=24,
                                     dropout_p=0.2, dtype=dtype)
    assert report.passed, str(report)
    worst = max(r.max_abs_err for r in report.rows)
    assert worst < (1e-5 if dtype == torch.float32 else 1e-13)
    assert len(report.rows) == 9 * t


def test_same_seed_gives_the_same_block_at_every_world_size_with_dropout_on():
    ln, fc1, fc2, x, dy = make_block_inputs(12, 2, 6, 24, torch.float64, seed=5)
    first = None
    for t in (1, 2, 3, 4):
        got = _gathered(run(_block_job, ln, fc1, fc2, x, dy, 0.3, 11, world_size=t))
        if first is None:
            first = got
            continue
        for a, b in zip(got, first):
            assert torch.allclose(a, b, rtol=0, atol=1e-12)
    # dropout really is on, and a different seed gives a different mask, so a different output
    no_dropout = _gathered(run(_block_job, ln, fc1, fc2, x, dy, 0.0, 11, world_size=2))
    other = _gathered(run(_block_job, ln, fc1, fc2, x, dy, 0.3, 12, world_size=2))
    assert not torch.allclose(no_dropout[0], first[0])
    assert not torch.allclose(other[0], first[0])


def test_every_rank_ends_backward_with_the_full_layernorm_and_bias_grads():
    ln, fc1, fc2, x, dy = make_block_inputs(8, 2, 4, 8, torch.float64, seed=1)
    res = run(_block_job, ln, fc1, fc2, x, dy, 0.1, 0, world_size=4)
    for name in ("ln.weight", "ln.bias", "fc2.bias"):
        assert all(torch.equal(r[2][name], res[0][2][name]) for r in res)
    rec = res[0][3]
    names = {e.operator for e in rec.select("all_reduce")}
    assert names == {"ln.weight", "ln.bias", "fc2.bias"}
    assert rec.count("all_gather") == 2 and rec.count("reduce_scatter") == 2


def test_re_gathering_fc1_input_gives_the_same_grads_with_one_more_all_gather():
    ln, fc1, fc2, x, dy = make_block_inputs(8, 3, 4, 8, torch.float64, seed=2)
    plain = run(_block_job, ln, fc1, fc2, x, dy, 0.1, 0, world_size=2)
    regather = run(_block_job, ln, fc1, fc2, x, dy, 0.1, 0, True, world_size=2)
    for a, b in zip(_gathered(plain), _gathered(regather)):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)
    assert regather[0][3].count("all_gather", "backward") == 2
    assert plain[0][3].count("all_gather", "backward") == 1


def test_tensor_parallel_twin_computes_the_same_block():
    ln, fc1, fc2, x, dy = make_block_inputs(8, 2, 4, 8, torch.float64, seed=3)

    def job():
        block = TensorParallelMLPBlock.from_full(ln, fc1, fc2, 0.2, 4)
        xx = x.clone().requires_grad_(True)
        with record() as rec:
            y = block(xx)
            y.backward(dy)
        return y.detach(), xx.grad, rec

    sp_y, sp_dx, *_ = _gathered(run(_block_job, ln, fc1, fc2, x, dy, 0.2, 4, world_size=2))
    for y, dx, rec in run(job, world_size=2):
        assert torch.allclose(y, sp_y, atol=1e-12) and torch.allclose(dx, sp_dx, atol=1e-12)
        assert [(e.op, e.direction) for e in rec.communicating()] == [("all_reduce", "forward"),
                                                                       ("all_reduce", "backward")]


def test_block_refuses_shapes_that_do_not_fit():
    ln, fc1, fc2, *_ = make_block_inputs(4, 1, 4, 8)
    with pytest.raises(ValueError, match="block shapes disagree"):
        SequenceParallelMLPBlock.from_full(nn.LayerNorm(5), fc1, fc2)


def test_minimal_demo_layernorm_on_a_shard_dropout_gather_and_grad_all_reduce():
    gen = torch.Generator().manual_seed(0)
    ln = nn.LayerNorm(4, dtype=torch.float64)
    with torch.no_grad():
        ln.weight.normal_(generator=gen)
    x = torch.randn(6, 2, 4, generator=gen, dtype=torch.float64)
    dy = torch.randn(6, 2, 4, generator=gen, dtype=torch.float64)
    ref = layernorm_dropout_reference(ln, x, dy, 0.25, 3)
    for t in (1, 2, 3):
        for r, res in enumerate(run(layernorm_dropout_on_shard, ln, x, dy, 0.25, 3, world_size=t)):
            lo, hi = res["rows"]
            assert (lo, hi) == (6 * r // t, 6 * (r + 1) // t)
            assert torch.allclose(res["output"], ref["output"], atol=1e-14)
            assert torch.allclose(res["input_grad"], ref["input_grad"][lo:hi], atol=1e-14)
            for k in ("ln.weight_grad", "ln.bias_grad"):
                assert torch.allclose(res[k], ref[k], atol=1e-13)


def test_measured_memory_equals_the_model_and_sp_saves_the_sharded_activations():
    figures = measure_activation_memory((1, 2, 4), seq_len=8, batch=2, hidden=4, ffn_hidden=16,
                                        dropout_p=0.1)
    assert [f["world_size"] for f in figures] == [1, 2, 4]
    for fig in figures:
        t, v = fig["world_size"], fig["variants"]
        for variant in v.values():
            assert variant["measured_total"] == variant["model_total"]
            assert {k: variant["measured"][k] for k in TERMS} == variant["model"]
            assert len(set(variant["per_rank_total"])) == 1       # every rank saves the same
        tp, sp, sp2 = v["tp"]["measured"], v["sp"]["measured"], v["sp_regather"]["measured"]
        for term in ("LayerNorm input", "dropout mask"):         # sharded by SP
            assert sp[term] * t == tp[term]
        assert sp["fc1 input"] == tp["fc1 input"] and sp2["fc1 input"] * t == tp["fc1 input"]
        assert sp["GeLU input"] == tp["GeLU input"] == 4 * 8 * 2 * 16 // t
        if t > 1:
            assert v["sp"]["measured_total"] < v["tp"]["measured_total"]
            assert v["sp_regather"]["measured_total"] < v["sp"]["measured_total"]
        # the bytes on the wire: TP's 2 all-reduces == SP's 2 all-gathers + 2 reduce-scatters
        comm = {k: x["communication"] for k, x in v.items()}
        assert comm["tp"]["activation_sent"] == comm["sp"]["activation_sent"]
        assert comm["tp"]["activation_sent"] == 4 * (t - 1) * 8 * 2 * 4 * 4 // t
        assert comm["sp_regather"]["activation_sent"] == comm["sp"]["activation_sent"] + (t - 1) * 8 * 2 * 4 * 4 // t
        assert comm["tp"]["param_grad_sent"] == 0 and comm["sp"]["param_grad_allreduces"] == 3


def test_activation_model_is_korthikantis_mlp_and_layernorm_terms():
    # fp16 (2 bytes), ffn = 4h, no parallelism: LayerNorm 2sbh + MLP 19sbh = 21 sbh
    s, b, h = 16, 2, 8
    assert sum(activation_model("tp", s, b, h, 4 * h, 1, 2).values()) == 21 * s * b * h
    # TP only at t: 5 sbh replicated + 16 sbh / t; TP + SP with re-gather: 21 sbh / t
    assert sum(activation_model("tp", s, b, h, 4 * h, 4, 2).values()) == (5 + 16 // 4) * s * b * h
    assert sum(activation_model("sp_regather", s, b, h, 4 * h, 4, 2).values()) * 4 == 21 * s * b * h
    assert activation_model("sp", s, b, h, 4 * h, 4, 2, dropout=False)["dropout mask"] == 0
    with pytest.raises(ValueError, match="unknown variant"):
        activation_model("zero", s, b, h, h, 1, 2)


def test_dropout_mask_figure_names_the_probability_dropout_p():
    # the course's p is a number of ranks; the dropout probability is always dropout_p
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from mtb_helpers.sp.plots import plot_dropout_masks
    fig = plot_dropout_masks(seq_len=4, batch=1, hidden=2, dropout_p=0.5, seed=1, world_size=2)
    assert "dropout_p = 0.5" in fig._suptitle.get_text()
    white = [a for ax in fig.axes[:2] for a in ax.patches if a.get_facecolor()[:3] == (1.0, 1.0, 1.0)]
    assert 0 < len(white) < 2 * 4 * 2   # some dropped, not all
    plt.close(fig)
