"""Tensor-parallel attention: equal to nn.MultiheadAttention and to PyTorch's own tensor
parallelism (DTensor), one f and one g, every bug caught on exactly what it breaks, refusals."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mtb_helpers import BUGS, RankError, run
from mtb_helpers.checking.bug import names_for
from mtb_helpers.tp.attention_bugs import BUGS as ATTENTION_BUGS
from mtb_helpers.comm import record
from mtb_helpers.tp import ParallelSelfAttention
from mtb_helpers.tp.attention import check_heads
from mtb_helpers.tp.attention_check import QUANTITIES, check_tp_attention, draw_attention_inputs


def _inputs(h=12, s=5, b=2, seed=0):
    layers, x, dy = draw_attention_inputs(seed, s, b, h, torch.float64)
    return layers, x, dy


def _mha(layers, n_heads):
    wq, wk, wv, wo = layers
    h = wq.in_features
    mha = nn.MultiheadAttention(h, n_heads, dtype=torch.float64)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([wq.weight, wk.weight, wv.weight]))
        mha.in_proj_bias.copy_(torch.cat([wq.bias, wk.bias, wv.bias]))
        mha.out_proj.weight.copy_(wo.weight)
        mha.out_proj.bias.copy_(wo.bias)
    return mha


def _ours(layers, x, dy, n_heads, causal):
    attn = ParallelSelfAttention.from_full(*layers, n_heads=n_heads, causal=causal)
    x = x.clone().requires_grad_(True)
    with record() as rec:
        y = attn(x)
        y.backward(dy)
    return {"y": y.detach(), "dx": x.grad, "rec": rec, "wq_grad": attn.qkv.weight.grad,
            "wo_grad": attn.out.weight.grad, "bo_grad": attn.out.bias.grad}


@pytest.mark.parametrize("t, n_heads, causal", [(1, 6, True), (2, 6, False), (3, 6, True),
                                                (4, 4, True)])
def test_equals_nn_multihead_attention_forward_and_backward(t, n_heads, causal):
    layers, x, dy = _inputs()
    mha = _mha(layers, n_heads)
    xr = x.clone().requires_grad_(True)
    mask = torch.ones(5, 5, dtype=torch.bool).triu(1) if causal else None
    y = mha(xr, xr, xr, attn_mask=mask, need_weights=False)[0]
    y.backward(dy)
    for r, out in enumerate(run(_ours, layers, x, dy, n_heads, causal, world_size=t)):
        assert (out["y"] - y).abs().max() < 1e-12
        assert (out["dx"] - xr.grad).abs().max() < 1e-12
        h = 12 // t
        # rank r's Q rows are the in-projection rows of its heads
        want = mha.in_proj_weight.grad[r * h:(r + 1) * h]
        assert (out["wq_grad"][:h] - want).abs().max() < 1e-12
        assert (out["wo_grad"] - mha.out_proj.weight.grad[:, r * h:(r + 1) * h]).abs().max() < 1e-12
        assert (out["bo_grad"] - mha.out_proj.bias.grad).abs().max() < 1e-12


def test_exactly_one_f_and_one_g():
    layers, x, dy = _inputs()
    for out in run(_ours, layers, x, dy, 6, True, world_size=3):
        rec = out["rec"]
        comm = rec.communicating()
        assert [(e.op, e.operator, e.direction) for e in comm] == [
            ("all_reduce", "g", "forward"), ("all_reduce", "f", "backward")]
        assert all(e.shape == (5, 2, 12) for e in comm)          # [s, b, h] both ways


class _Attention(nn.Module):
    """A plain attention block for PyTorch's parallelize_module (heads from self.n_heads)."""

    def __init__(self, layers, n_heads, causal):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(lin.in_features, lin.out_features,
                                                        dtype=lin.weight.dtype) for lin in layers)
        for mine, lin in zip((self.wq, self.wk, self.wv, self.wo), layers):
            mine.load_state_dict(lin.state_dict())
        self.n_heads, self.causal = n_heads, causal

    def forward(self, x):
        s, b, _ = x.shape

        def heads(z):
            return z.reshape(s, b, self.n_heads, -1).permute(1, 2, 0, 3)

        ctx = F.scaled_dot_product_attention(heads(self.wq(x)), heads(self.wk(x)),
                                             heads(self.wv(x)), is_causal=self.causal)
        return self.wo(ctx.permute(2, 0, 1, 3).reshape(s, b, -1))


def _against_dtensor(layers, x, dy, n_heads):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    t = dist.get_world_size()
    ref = _Attention(layers, n_heads, True)
    plan = {"wq": ColwiseParallel(), "wk": ColwiseParallel(), "wv": ColwiseParallel(),
            "wo": RowwiseParallel()}
    parallelize_module(ref, init_device_mesh("cpu", (t,)), plan)
    ref.n_heads = n_heads // t          # each rank now runs its own heads
    xr = x.clone().requires_grad_(True)
    y = ref(xr)
    y.backward(dy)
    ours = _ours(layers, x, dy, n_heads, True)
    h = x.shape[-1] // t
    return {"y": (ours["y"] - y).abs().max().item(), "dx": (ours["dx"] - xr.grad).abs().max().item(),
            "wq": (ours["wq_grad"][:h] - ref.wq.weight.grad.to_local()).abs().max().item(),
            "wv": (ours["wq_grad"][2 * h:] - ref.wv.weight.grad.to_local()).abs().max().item(),
            "wo": (ours["wo_grad"] - ref.wo.weight.grad.to_local()).abs().max().item()}


@pytest.mark.parametrize("t", [2, 3])
def test_agrees_with_pytorch_colwise_rowwise_parallel_on_the_same_ranks(t):
    layers, x, dy = _inputs()
    for errs in run(_against_dtensor, layers, x, dy, 6, world_size=t, timeout=60):
        assert max(errs.values()) < 1e-12, errs


@pytest.mark.parametrize("t, kwargs, dtype", [(1, {}, "float32"), (2, {}, "float64"),
                                              (3, {"n_heads": 6, "head_dim": 3}, "float64"),
                                              (4, {"causal": False}, "float32")])
def test_check_passes_with_fp64_exact_to_1e_12(t, kwargs, dtype):
    report = check_tp_attention(world_size=t, dtype=dtype, **kwargs)
    assert report.passed, str(report)
    assert report.quantities() == list(QUANTITIES) and len(report.rows) == 6 * t
    assert all(s.passed for s in report.steps)
    if dtype == "float64":
        assert max(r.max_abs_err for r in report.rows) < 1e-12
    else:
        assert all(r.ulps < 64 for r in report.rows)
    assert [e.operator for e in report.records[0].communicating()] == ["g", "f"]


BROKEN = [
    ("attn-heads-not-divided", {"input_grad", "output", "qkv.weight_grad", "qkv.bias_grad",
                                "out.weight_grad"}),
    ("attn-qkv-without-f", {"input_grad"}),
    ("attn-wo-bias-every-rank", {"output"}),
]


def test_every_attention_bug_is_registered_and_tested():
    assert set(names_for(ATTENTION_BUGS, "tp_attention")) == {b for b, _ in BROKEN}
    assert {b for b, _ in BROKEN} <= set(BUGS) and {b for b, _ in BROKEN} <= set(ATTENTION_BUGS)


@pytest.mark.parametrize("t, kwargs", [(2, {}), (3, {"n_heads": 6, "head_dim": 3})])
@pytest.mark.parametrize("bug, broken", BROKEN, ids=[b for b, _ in BROKEN])
def test_bug_fails_exactly_the_quantities_it_breaks(bug, broken, t, kwargs):
    report = check_tp_attention(world_size=t, bug=bug, **kwargs)
    failed = {(r.quantity, r.rank) for r in report.failed()}
    assert failed == {(q, rank) for q in broken for rank in range(t)}, str(report)
    assert report.config["bug"] == bug


def test_trace_shows_where_each_bug_goes_wrong():
    heads = check_tp_attention(world_size=2, bug="attn-heads-not-divided")
    first = next(s for s in heads.steps if not s.passed)
    assert first.name == "attention on own heads"       # Q, K, V themselves are still right
    no_f = check_tp_attention(world_size=2, bug="attn-qkv-without-f")
    step = no_f.step("all-reduce dX (f backward)")
    assert step.collective["missing"] and no_f.records[0].count("all_reduce", "backward") == 0


def test_one_rank_has_nothing_to_get_wrong():
    for bug, _ in BROKEN:
        assert check_tp_attention(world_size=1, bug=bug).passed


def _refused_in_rank(layers):
    return ParallelSelfAttention.from_full(*layers, n_heads=4)


def test_heads_that_do_not_divide_are_refused_by_the_layer_and_the_check(no_ranks):
    with pytest.raises(ValueError, match=r"n_heads=4 .* world size 3"):
        check_heads(12, 4, 3)
    with pytest.raises(ValueError, match=r"hidden=10 .* n_heads=4"):
        check_heads(10, 4, 1)
    layers, _, _ = _inputs()
    with pytest.raises(RankError, match=r"n_heads=4 is not divisible by the world size 3"):
        run(_refused_in_rank, layers, world_size=3)


@pytest.mark.parametrize("call, message", [
    (lambda: check_tp_attention(world_size=3, n_heads=4), r"n_heads=4 .* world size 3"),
    (lambda: check_tp_attention(world_size=4, n_heads=6), r"n_heads=6 .* world size 4"),
    (lambda: check_tp_attention(world_size=2, bug="attn-heads-not-divided", head_dim=3),
     r"needs head_dim divisible by the world size.*given head_dim=3, world_size=2"),
    (lambda: check_tp_attention(seq=0), r"seq must be a positive integer"),
    (lambda: check_tp_attention(world_size=9), r"world.size"),
    (lambda: check_tp_attention(dtype=torch.float16), r"dtype"),
    (lambda: check_tp_attention(bug="no-such-bug"), r"unknown bug"),
    (lambda: check_tp_attention(bug="vocab-ce-max-not-allreduced"), r"does not apply"),
])
def test_bad_input_is_refused_before_any_rank_starts(no_ranks, call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_layer_refuses_projections_of_the_wrong_shape():
    layers, _, _ = _inputs()
    with pytest.raises(ValueError, match=r"wk is nn.Linear\(12, 6\)"):
        ParallelSelfAttention.from_full(layers[0], nn.Linear(12, 6), layers[2], layers[3], 6)
    from torch.distributed.tensor import Replicate
    assert ParallelSelfAttention.input_layouts == ParallelSelfAttention.output_layouts == Replicate()


def test_figures_have_titles_labels_legends_and_rank_colours():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mtb_helpers.plots.palette import rank_color
    from mtb_helpers.tp.attention_plots import (plot_attention_flow, plot_ce_allreduces,
                                                plot_head_split, plot_vocab_split)

    heads = plot_head_split(n_heads=4, head_dim=2, world_size=2)
    wq = heads.axes[0]
    owners = [p.get_facecolor() for p in wq.patches]
    assert len(owners) == 4 and all(matplotlib.colors.same_color(c, rank_color(i // 2))
                                    for i, c in enumerate(owners))
    assert heads._suptitle.get_text() and heads.legends and wq.get_xlabel() and wq.get_ylabel()
    flow = plot_attention_flow(world_size=3, n_heads=6)
    ax = flow.axes[0]
    assert "one f, one g" in ax.get_title() and ax.get_legend() and ax.get_xlabel()
    vocab = plot_vocab_split(torch.tensor([[0, 11], [5, 6]]), vocab=12, world_size=3)
    cells = vocab.axes[1].patches
    assert [matplotlib.colors.same_color(p.get_facecolor(), rank_color(r))
            for p, r in zip(cells, (0, 2, 1, 1))] == [True] * 4
    local = {k: torch.rand(3, 5) for k in ("max", "sum_exp", "target_logit")}
    ce = plot_ce_allreduces(local, {k: v.sum(0) for k, v in local.items()})
    assert len(ce.axes) == 3 and all(a.get_title() and a.get_ylabel() for a in ce.axes)
    assert ce.legends
    plt.close("all")


def _in_subgroups(layers, x, dy):
    # ranks {0, 1} and {2, 3} are two tensor-parallel groups of 2 (as on a tp x dp grid)
    import torch.distributed as dist
    r = dist.get_rank()
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    group = groups[r // 2]
    attn = ParallelSelfAttention.from_full(*layers, n_heads=6, group=group)
    x = x.clone().requires_grad_(True)
    with record() as rec:
        y = attn(x)
        y.backward(dy)
    return y.detach(), x.grad, attn.qkv.weight.detach(), [e.group_size for e in rec.communicating()]


def test_heads_split_inside_a_subgroup():
    layers, x, dy = _inputs()
    mha = _mha(layers, 6)
    xr = x.clone().requires_grad_(True)
    y = mha(xr, xr, xr, attn_mask=torch.ones(5, 5, dtype=torch.bool).triu(1), need_weights=False)[0]
    y.backward(dy)
    results = run(_in_subgroups, layers, x, dy, world_size=4)
    for r, (out, dx, w_qkv, sizes) in enumerate(results):
        assert (out - y).abs().max() < 1e-12 and (dx - xr.grad).abs().max() < 1e-12
        assert sizes == [2, 2]                       # g and f ran in the group of 2, not the world
    # rank 2 holds what rank 0 holds: the same heads, in the other group
    assert torch.equal(results[0][2], results[2][2]) and not torch.equal(results[0][2], results[1][2])
