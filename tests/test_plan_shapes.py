"""One statement of a layer's matrices (``plan.specs.linears``) behind the parameter count, the
matmul FLOPs and the matmul time, and one validator for every description (``plan.specs.Spec``).
Arithmetic only."""
from __future__ import annotations

import pytest

from mtb_helpers.plan import MODELS, layer_params, model
from mtb_helpers.plan.published import NARAYANAN_2021_TABLE_1
from mtb_helpers.plan.specs import NORMS, linears
from mtb_helpers.plan.steptime import matmul_params


@pytest.mark.parametrize("name", ["gpt3-175b", "llama3-8b", "mixtral-8x7b", "tiny-gpt"])
def test_parameters_and_flops_count_the_same_matrices(name, no_ranks):
    m = MODELS[name]
    tp = 2 if name == "tiny-gpt" else 8
    held = layer_params(m, tp)
    norms = 2 * NORMS[m.norm] * m.hidden
    if m.experts == 1:
        # this rank's weights are a tp-th of the ones a token multiplies by, besides norms and biases
        biases = sum(n_out for _, n_out, _ in linears(m, tp)) if m.bias else 0
        assert held["dense"] - norms - biases == matmul_params(m) / tp
    else:
        # every expert's MLP, of which a token uses top_k
        mlp = (3 if m.gated_mlp else 2) * m.hidden * m.ffn_hidden
        assert held["experts"] == m.experts * mlp / tp
        assert matmul_params(m, active=False) - matmul_params(m) == (m.experts - m.top_k) * mlp


def test_a_gated_mlp_with_biases_has_three_of_them(no_ranks):
    m = model("llama3-8b").with_(bias=True)
    plain = layer_params(model("llama3-8b"))["dense"]
    h, f, kv_out = m.hidden, m.ffn_hidden, (m.heads + 2 * m.kv_heads) * m.head_dim
    assert layer_params(m)["dense"] - plain == kv_out + h + 2 * f + h    # qkv, proj, gate + up, down


@pytest.mark.parametrize("tp,match", [(3, "heads=4 is not divisible by tp=3"),
                                      (8, "kv_heads=4 is not divisible by tp=8")])
def test_a_layer_that_tp_cannot_split_is_refused_by_name(tp, match, no_ranks):
    with pytest.raises(ValueError, match=match):
        layer_params(model("tiny-gpt"), tp)


@pytest.mark.parametrize("change,match", [(dict(tflops_per_gpu=-1.0), "tflops_per_gpu"),
                                          (dict(params_billion=float("nan")), "params_billion"),
                                          (dict(ddp=None), "ddp")])
def test_every_declared_number_of_a_published_row_is_checked(change, match, no_ranks):
    with pytest.raises(ValueError, match=match):
        NARAYANAN_2021_TABLE_1[0].with_(**change)
