"""The planner's memory formulas against the numbers papers publish, and its refusals.

Sources: Rajbhandari et al. 2020 (ZeRO), Figure 1; Korthikanti et al. 2022, Table 2 and sec. 5;
Narayanan et al. 2021 (SC), Table 1 and their parameter-count formula (sec. 5.1); the model cards
(parameter counts) and Dubey et al. 2024 (Llama 3), Table 3. Arithmetic only: no rank starts.
"""
from __future__ import annotations

import math

import pytest

from mtb_helpers.capstone.model import GPTConfig, make_model
from mtb_helpers.plan import (GIB, Layout, ModelSpec, activation_bytes_per_layer, check_layout,
                              cluster, layout_problems, memory_per_rank, model, model_state_bytes,
                              stage_layers, stage_params, tiny_gpt, total_params)
from mtb_helpers.plan.memory import MemoryModel


# ---- ZeRO, Figure 1: 7.5B parameters, N_d = 64, K = 12 -------------------------------------------

def test_pinned_zero3_value():
    assert model_state_bytes(7.5e9, dp=64, zero_stage=3) == 1.875e9


def test_zero_paper_figure_1_in_decimal_gigabytes():
    gb = [model_state_bytes(7.5e9, dp=64, zero_stage=s) / 1e9 for s in range(4)]
    assert gb[0] == 120.0
    assert [round(gb[1], 1), round(gb[2], 1), round(gb[3], 2)] == [31.4, 16.6, 1.88]
    # the paper's GB is 1e9 bytes: in GiB the baseline would read 111.8, not 120
    assert round(model_state_bytes(7.5e9, 64, 0) / GIB, 1) == 111.8


def test_model_states_by_term_follow_the_stages():
    mm = MemoryModel()
    psi, n = 1000.0, 10
    assert mm.model_states(psi, n, 0) == {"parameters": 2000, "gradients": 2000,
                                          "optimizer states": 12000}
    assert mm.model_states(psi, n, 1)["optimizer states"] == 1200
    assert mm.model_states(psi, n, 2)["gradients"] == 200
    assert mm.model_states(psi, n, 3)["parameters"] == 200
    # padding: 1001 parameters over 10 ranks -> 101 per shard, flat buffers of 1010
    padded = mm.model_states(1001, 10, 1, pad=True)
    assert padded["optimizer states"] == 12 * 101 and padded["parameters"] == 2 * 1010
    assert mm.model_states(1001, 10, 0, pad=True)["parameters"] == 2 * 1001


@pytest.mark.parametrize("bad", [dict(num_params=0), dict(num_params=math.nan),
                                 dict(num_params=-1.0), dict(dp=0), dict(dp=2.5),
                                 dict(zero_stage=4), dict(optimizer_bytes_per_param=math.inf)])
def test_model_state_bytes_refuses_bad_input_naming_it(bad):
    args = dict(num_params=7.5e9, dp=64, zero_stage=1) | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        model_state_bytes(**args)


# ---- Korthikanti et al. 2022, Table 2 ---------------------------------------------------------------

CASES = [(2048, 1, 12288, 96, 8), (2048, 4, 6144, 48, 8), (2048, 1, 20480, 128, 8),
         (1024, 2, 4096, 32, 4)]


@pytest.mark.parametrize("s,b,h,a,t", CASES)
def test_table_2_rows(s, b, h, a, t):
    sbh = s * b * h
    rows = {
        (1, False, "none"): sbh * (34 + 5 * a * s / h),
        (t, False, "none"): sbh * (10 + 24 / t + 5 * a * s / (h * t)),
        (t, True, "none"): sbh / t * (34 + 5 * a * s / h),
        (t, False, "selective"): sbh * (10 + 24 / t),
        (t, True, "selective"): sbh * 34 / t,
        (t, False, "full"): 2 * sbh,
        (1, False, "full"): 2 * sbh,
    }
    for (tp, sp, rc), want in rows.items():
        got = activation_bytes_per_layer(s, b, h, a, tp=tp, sequence_parallel=sp, recompute=rc)
        assert got == pytest.approx(want, rel=1e-12), (tp, sp, rc)


def test_design_example_gpt3_tp8_sp():
    assert activation_bytes_per_layer(2048, 1, 12288, 96, tp=8, sequence_parallel=True) \
        == 2048 * 12288 // 8 * (34 + 80)


def test_selective_recompute_saves_what_the_paper_says():
    """Sec. 5: the 5as/h term is 80 for GPT-3 and 64 for MT-NLG; selective recompute removes
    70 % and 65 % of the activations; with sequence parallelism too, 5x less than TP alone."""
    for h, a, saving in ((12288, 96, 70), (20480, 128, 65)):
        full = activation_bytes_per_layer(2048, 1, h, a, tp=8)
        sel = activation_bytes_per_layer(2048, 1, h, a, tp=8, recompute="selective")
        assert round(100 * (1 - activation_bytes_per_layer(2048, 1, h, a, recompute="selective")
                            / activation_bytes_per_layer(2048, 1, h, a))) == saving
        both = activation_bytes_per_layer(2048, 1, h, a, tp=8, sequence_parallel=True,
                                          recompute="selective")
        assert round(full / both) == 5 and sel < full


def test_details_generalise_the_table():
    base = activation_bytes_per_layer(128, 2, 64, 8)
    sbh = 128 * 2 * 64
    # no dropout: the two sbh masks and the 1-byte + 2-byte score terms go
    assert base - activation_bytes_per_layer(128, 2, 64, 8, dropout=False) \
        == 2 * sbh + 3 * 8 * 128 * 128 * 2
    # SwiGLU with f = 4h, as PyTorch eager keeps it: 4 x 2sbf (gate, up, silu(gate), product)
    # instead of GeLU's 2 x 2sbf
    assert activation_bytes_per_layer(128, 2, 64, 8, gated_mlp=True) - base == 2 * 2 * 128 * 2 * 256
    # grouped-query attention: K and V shrink by kv/a
    assert base - activation_bytes_per_layer(128, 2, 64, 8, kv_heads=2) == 2 * 2 * sbh * 6 / 8
    assert activation_bytes_per_layer(128, 2, 64, 8, dtype_bytes=4, dropout=False) \
        == 2 * activation_bytes_per_layer(128, 2, 64, 8, dropout=False)


@pytest.mark.parametrize("bad,match", [(dict(tp=5), "tp=5"), (dict(heads=7), "heads=7"),
                                       (dict(recompute="some"), "recompute"),
                                       (dict(seq=0), "seq"), (dict(sequence_parallel=True, seq=100,
                                                                   tp=8), "seq=100")])
def test_activation_bytes_refuses_bad_input(bad, match):
    args = dict(seq=2048, batch=1, hidden=12288, heads=96) | bad
    with pytest.raises(ValueError, match=match):
        activation_bytes_per_layer(**args)


# ---- parameter counts -------------------------------------------------------------------------------

NARAYANAN_TABLE_1 = [(24, 2304, 24, 1.7), (30, 3072, 32, 3.6), (36, 4096, 32, 7.5),
                     (40, 6144, 48, 18.4), (48, 8192, 64, 39.1), (60, 10240, 80, 76.1),
                     (80, 12288, 96, 145.6), (96, 16384, 128, 310.1), (105, 20480, 128, 529.6),
                     (128, 25600, 160, 1008.0)]


@pytest.mark.parametrize("l,h,a,billions", NARAYANAN_TABLE_1)
def test_narayanan_table_1_parameter_counts(l, h, a, billions):
    """P = 12lh^2 (1 + 13/(12h) + (V + s)/(12lh)) with V = 51200, s = 2048 (sec. 5.1): ours adds
    the final LayerNorm (2h), which their formula leaves out."""
    gpt = ModelSpec(layers=l, hidden=h, heads=a, kv_heads=a, ffn_hidden=4 * h, vocab=51200,
                    seq_len=2048, bias=True, norm="layernorm", tied_embeddings=True,
                    learned_positions=True)
    theirs = 12 * l * h * h + 13 * l * h + (51200 + 2048) * h
    assert total_params(gpt) == theirs + 2 * h
    assert round(total_params(gpt) / 1e9, 1) == billions


@pytest.mark.parametrize("name,count", [("llama3-8b", 8_030_261_248), ("llama3-70b", 70_553_706_496),
                                        ("llama3-405b", 405_853_388_800),
                                        ("mixtral-8x7b", 46_702_792_704)])
def test_preset_counts_equal_the_released_checkpoints(name, count):
    # the safetensors index of each released checkpoint (total_size / 2 bytes for bf16)
    assert total_params(model(name)) == count


def test_gpt3_is_175b_and_tiny_gpt_is_the_capstone_model():
    assert round(total_params(model("gpt3-175b")) / 1e9) == 175
    assert total_params(model("tiny-gpt")) == sum(p.numel() for p in make_model().parameters())
    other = GPTConfig(hidden=16, heads=2, layers=2, ffn=24, vocab=12, seq=8)
    assert total_params(tiny_gpt(other)) == sum(p.numel() for p in make_model(other).parameters())


# ---- per rank ---------------------------------------------------------------------------------------

def test_stage_layers_follow_llama3s_balancing():
    assert stage_layers(126, 16) == [7] + [8] * 14 + [7]
    assert stage_layers(32, 4) == [8] * 4
    assert stage_layers(126, 12) is None and stage_layers(33, 2) == [16, 17]


def test_embedding_on_first_stage_output_on_last():
    m = model("llama3-8b")
    p = [stage_params(m, Layout(pp=4, dp=2), r)["dense"] for r in range(4)]
    embed = 128256 * 4096
    assert p[0] - p[1] == embed and p[3] - p[1] == embed + 4096 and p[1] == p[2]
    tied = model("gpt3-175b")
    one = stage_params(tied, Layout(), 0)["dense"]
    two = sum(stage_params(tied, Layout(pp=2), r)["dense"] for r in range(2))
    assert two - one == (50257 * 12288)   # Megatron keeps a copy on the last stage


def test_in_flight_micro_batches_come_from_the_simulator():
    m = model("llama3-8b")
    one = memory_per_rank(m, Layout(pp=4, grad_accum=8))
    assert [s.inflight for s in one] == [4, 3, 2, 1]
    assert [s.inflight for s in memory_per_rank(m, Layout(pp=4, grad_accum=8, schedule="gpipe"))] \
        == [8] * 4
    per_layer = activation_bytes_per_layer(8192, 1, 4096, 32, kv_heads=8, ffn_hidden=14336,
                                           gated_mlp=True, dropout=False, attention="flash")
    assert one[1].terms["activations"] == 3 * 8 * per_layer
    # the last stage adds fp32 logits 4 s b V and the inputs of the final norm and output layer
    assert one[3].terms["embedding and output activations"] == 4 * 8192 * 128256 + 4 * 8192 * 4096


def test_recompute_and_zero3_terms():
    m = model("llama3-8b")
    full = memory_per_rank(m, Layout(dp=8, recompute="full", zero_stage=3))[0].terms
    assert full["activations"] == 32 * 2 * 8192 * 4096
    assert full["recompute working set"] == activation_bytes_per_layer(
        8192, 1, 4096, 32, kv_heads=8, ffn_hidden=14336, gated_mlp=True, dropout=False,
        attention="flash")
    assert full["ZeRO-3 gathered layers"] > 0
    assert memory_per_rank(m, Layout(dp=8))[0].terms["ZeRO-3 gathered layers"] == 0


# ---- refusals ---------------------------------------------------------------------------------------

def test_layout_problems_name_each_constraint():
    m, c = model("llama3-8b"), cluster("h100", gpus=64)
    assert layout_problems(m, c, Layout(tp=8, pp=2, dp=4, grad_accum=4), 16) == []
    problems = " | ".join(layout_problems(m, c, Layout(tp=16, pp=5, dp=1), 1024))
    assert "tp=16 exceeds 8 GPUs per node" in problems
    assert "80 ranks, but the cluster has 64 GPUs" in problems
    assert "layers=32 do not split over pp*chunks = 5*1" in problems
    assert "not the global batch 1024" in problems
    assert "kv_heads=8 is not divisible by tp=16" in " | ".join(
        layout_problems(m, cluster("h100", gpus=16, gpus_per_node=16), Layout(tp=16), None))
    with pytest.raises(ValueError, match="tp=16 exceeds"):
        check_layout(m, c, Layout(tp=16, dp=4))


@pytest.mark.parametrize("make,match", [
    (lambda: model("llama-3-8b"), "unknown model 'llama-3-8b'; presets: gpt3-175b"),
    (lambda: cluster("tpu"), "unknown cluster"),
    (lambda: cluster("h100", gpus=12), "whole number of 8-GPU nodes"),
    (lambda: cluster("h100", memory_gib=math.nan), "memory_gib"),
    (lambda: model("llama3-8b").with_(hidden=0), "hidden"),
    (lambda: model("llama3-8b").with_(heads=33), "heads=33"),
    (lambda: cluster("h100").with_(peak_flops=-1.0), "peak_flops"),
    (lambda: cluster("h100").with_(intra_node=5.0), "intra_node"),
    (lambda: Layout(tp=0), "tp"),
    (lambda: Layout(schedule="1f2b"), "schedule"),
    (lambda: Layout(schedule="interleaved"), "chunks"),
    (lambda: Layout(recompute="half"), "recompute"),
    (lambda: Layout(zero_stage=True), "zero_stage"),
])
def test_bad_descriptions_are_refused_by_name(make, match):
    with pytest.raises(ValueError, match=match):
        make()
