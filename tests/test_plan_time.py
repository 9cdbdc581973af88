"""The planner's step time and ranking: FLOPs against Narayanan et al. 2021's formula, each group's
link, the simulator's bubble, overlap, and plan()'s ranking and refusals (Llama 3's Table 4
layout among them). Arithmetic only: no rank starts.
"""
from __future__ import annotations

import json
import math

import pytest

from mtb_helpers.cli import main
from mtb_helpers.cost import Link, predict
from mtb_helpers.plan import GIB, ClusterSpec, Layout, ModelSpec, cluster, model
from mtb_helpers.plan.budget import extrapolated, _peaks
from mtb_helpers.plan.search import plan
from mtb_helpers.plan.steptime import group_link, model_flops_per_token, step_time
from mtb_helpers.pp import schedule, simulate

GPT = dict(vocab=51200, seq_len=2048, bias=True, norm="layernorm", tied_embeddings=True,
           learned_positions=True, dropout=True)


def gpt(l: int, h: int, a: int) -> ModelSpec:
    return ModelSpec(layers=l, hidden=h, heads=a, kv_heads=a, ffn_hidden=4 * h, **GPT)


def one_gpu(flops: float = 1e15) -> ClusterSpec:
    link = Link(1e-6, 1e11)
    return ClusterSpec(1, 1, 80 * GIB, flops, link, link)


def test_model_flops_are_narayanans_72_bslh2():
    """Sec. 5.1: F = 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) per iteration without recompute."""
    for l, h, a in ((24, 2304, 24), (80, 12288, 96)):
        want = 72 * l * h * h * (1 + 2048 / (6 * h) + 51200 / (12 * l * h))
        assert model_flops_per_token(gpt(l, h, a)) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("recompute,factor,vocab_factor", [("full", 96, 16), ("none", 72, 12)])
def test_compute_time_counts_recompute_as_narayanan_does(recompute, factor, vocab_factor):
    """With full recompute their 96 B s l h^2 (1 + s/(6h) + V/(16 l h)): one more forward of
    every layer, none of the output layer."""
    l, h, a, B = 4, 1024, 16, 8
    st = step_time(gpt(l, h, a), one_gpu(), Layout(grad_accum=B, recompute=recompute), efficiency=0.5)
    want = factor * B * 2048 * l * h * h * (1 + 2048 / (6 * h) + 51200 / (vocab_factor * l * h))
    assert st.terms["compute"] * 1e15 * 0.5 == pytest.approx(want, rel=1e-12)
    if recompute == "none":   # nothing else to pay on one GPU: the step reaches the assumed MFU
        assert st.mfu == pytest.approx(0.5, rel=1e-12) and st.step == st.terms["compute"]


def test_each_group_uses_the_link_it_spans():
    slow, fast = Link(1e-3, 1e8), Link(1e-6, 1e12)
    c = ClusterSpec(8, 4, 80 * GIB, 1e15, fast, slow)
    assert group_link(c, 8) is fast and group_link(c, 9) is slow
    m = model("llama3-8b")
    inside = step_time(m, c, Layout(tp=8, dp=4, grad_accum=8), 0.5)
    faster_network = step_time(m, c.with_(inter_node=fast), Layout(tp=8, dp=4, grad_accum=8), 0.5)
    # tensor parallelism stays on NVLink: only the data-parallel term moves with the network
    assert inside.terms["tensor parallel"] == faster_network.terms["tensor parallel"] > 0
    assert inside.terms["data parallel"] > faster_network.terms["data parallel"]
    s, b, h = 8192, 1, 4096
    act = s * b * h * 2                                 # [s, b, h] in bf16

    def ar(n):
        return predict("all-reduce", n, 8, fast)
    # per micro-batch: 32 layers x (2 + 2) all-reduces' worth (SP's all-gathers and reduce-
    # scatters); the small ones: the embedding's g and its split's gather, the LM head's gather
    # and reduce-scatter, the cross-entropy's [s, b] (max) and [2, s, b] (the two sums fused);
    # once per step, the 32 x 2 RMSNorm grads + the final norm's in one all-reduce
    small = (ar(act) + 2 * predict("all-gather", act, 8, fast)
             + predict("reduce-scatter", act, 8, fast) + ar(s * b * 2) + ar(2 * s * b * 2))
    assert inside.terms["tensor parallel"] == pytest.approx(8 * (32 * 4 * ar(act) + small)
                                                            + ar(65 * h * 2), rel=1e-12)


def test_bubble_is_the_simulators():
    c = ClusterSpec(8, 1, 80 * GIB, 1e15, Link(1e-9, 1e15), Link(1e-9, 1e15))
    st = step_time(model("llama3-8b"), c, Layout(pp=4, dp=2, grad_accum=8), 0.5)
    sim = simulate(schedule("1f1b", 4, 8), 1.0, 2.0)   # FLOPs: backward twice the forward
    assert st.bubble_fraction == pytest.approx(sim.bubble_fraction, abs=1e-3)
    assert st.terms["pipeline bubble and p2p"] > 0


@pytest.mark.parametrize("name,chunks", [("1f1b", 1), ("gpipe", 1), ("interleaved", 2),
                                         ("zb-h1", 1)])
@pytest.mark.parametrize("p,m", [(4, 28), (8, 40), (2, 12)])
def test_extrapolating_long_pipelines_equals_simulating_them(name, chunks, p, m):
    def measure(ops):
        t = simulate(ops, forward=1.0, backward=2.3, latency=0.013)
        return t.makespan, sum(t.busy)
    ops = schedule(name, p, m, chunks if name == "interleaved" else None)
    assert extrapolated(measure, name, p, m, chunks) == pytest.approx(measure(ops), rel=1e-12)
    assert extrapolated(_peaks, name, p, m, chunks) == pytest.approx(_peaks(ops), rel=1e-12)


def test_overlap_hides_what_it_says():
    m, c = model("llama3-8b"), cluster("h100", gpus=64)
    layout = Layout(tp=8, dp=8, grad_accum=16, zero_stage=1)
    with_overlap, without = step_time(m, c, layout), step_time(m, c, layout, overlap=False)
    assert without.step - with_overlap.step == pytest.approx(with_overlap.hidden["data parallel"])
    assert with_overlap.hidden["data parallel"] > 0
    assert with_overlap.tokens_per_second == 8 * 16 * 8192 / with_overlap.step


def test_plan_ranks_fitting_layouts_and_says_why_others_fail():
    result = plan(model("llama3-8b"), cluster("h100", gpus=64), 1024)
    steps = [c.time.step for c in result.ranked]
    assert result.ranked and steps == sorted(steps)
    assert all(c.peak_bytes <= 80 * GIB for c in result.ranked)
    reasons = [w for _, why in result.rejected for w in why]
    assert any(w.startswith("tp=16 exceeds 8 GPUs per node") for w in reasons)
    memory = [w for w in reasons if w.startswith("needs ")]
    assert memory and all(float(w.split()[1]) > 80 for w in memory)
    assert "> 80 GiB" in memory[0]


@pytest.mark.parametrize("efficiency", [None, 0.5])
def test_llama3_405b_published_layout_ranks_first(efficiency, monkeypatch):
    """Dubey et al. 2024, Table 4: 8192 GPUs, TP 8, CP 1, PP 16, DP 64, 16M tokens per batch
    (2048 sequences of 8192). Among the layouts of that table's kind (no CP, ZeRO-1,
    FlashAttention, no recompute, one sequence per micro-batch), the planner picks the same one,
    once the MLP keeps what a fused SwiGLU keeps (three [s, f] tensors); with eager's four the
    published layout needs more than 80 GiB. Both with the measured compute curve and with a
    flat efficiency (plan() passes its ``mfu`` as step_time's efficiency)."""
    import mtb_helpers.plan.search as search
    real = search.step_time
    monkeypatch.setattr(search, "step_time", lambda m, c, lay, eff, overlap: real(m, c, lay, efficiency,
                                                                                 overlap))
    kind = dict(cp_sizes=(1,), zero_stages=(1,), recomputes=("none",), microbatches=(1,))
    fused = model("llama3-405b").with_(fused_swiglu=True)
    result = plan(fused, cluster("h100", gpus=8192), 2048, **kind)
    best = result.ranked[0].layout
    assert (best.tp, best.pp, best.dp, best.attention) == (8, 16, 64, "flash")
    assert result.ranked[0].peak_bytes < 80 * GIB
    eager = plan(model("llama3-405b"), cluster("h100", gpus=8192), 2048, **kind)
    assert [(c.layout.tp, c.layout.pp) for c in eager.ranked] == [(8, 64)]
    assert any((lay.tp, lay.pp) == (8, 16) and why[0].startswith("needs 84.")
               for lay, why in eager.rejected)


def test_plan_refuses_bad_arguments():
    with pytest.raises(ValueError, match="global_batch"):
        plan(model("llama3-8b"), cluster("h100"), 0)
    with pytest.raises(ValueError, match="efficiency"):
        step_time(model("llama3-8b"), cluster("h100"), Layout(dp=8), efficiency=1.5)
    with pytest.raises(ValueError, match="A100 has no measured compute curve"):
        step_time(model("llama3-8b"), cluster("a100"), Layout(dp=8))
    with pytest.raises(ValueError, match="mfu"):
        plan(model("llama3-8b"), cluster("h100"), 8, mfu=math.nan)


def test_cli_ranks_and_exits_by_verdict(capsys):
    assert main(["plan", "--model", "llama3-8b", "--gpus", "16", "--gpu-memory", "80",
                 "--global-batch", "64", "--json", "--top", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fit"] > 0 and len(out["ranked"]) == 3
    assert out["ranked"][0]["step_seconds"] <= out["ranked"][1]["step_seconds"]
    assert main(["plan", "--model", "llama3-405b", "--gpus", "8", "--global-batch", "8"]) == 1
    assert "no layout fits" in capsys.readouterr().out
    assert main(["plan", "--model", "llama-3-8b", "--gpus", "8", "--global-batch", "8"]) == 2
    assert "unknown model 'llama-3-8b'" in capsys.readouterr().err


def test_experts_are_split_over_ep_and_pay_all_to_alls():
    mixtral, c = model("mixtral-8x7b"), cluster("h100", gpus=64)
    from mtb_helpers.plan import stage_params
    one = stage_params(mixtral, Layout(tp=2, dp=32), 0)
    eight = stage_params(mixtral, Layout(tp=2, dp=32, ep=8), 0)
    assert one["experts"] == 8 * eight["experts"] and one["dense"] == eight["dense"]
    st = step_time(mixtral, c, Layout(tp=2, dp=32, ep=8, grad_accum=4))
    assert st.terms["expert parallel"] > 0
    assert step_time(mixtral, c, Layout(tp=2, dp=32, grad_accum=4)).terms["expert parallel"] == 0
