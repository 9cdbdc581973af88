"""The planner's ZeRO-2/3 model states next to DeepSpeed's own estimators (DeepSpeed 0.19.8, in the
``test`` extra; its estimators are arithmetic and import on a CPU without building any op): every
difference is a buffer ``deepspeed_extras`` names, to the byte."""
from __future__ import annotations

import pytest

from mtb_helpers.plan.memory import (RECORDED, deepspeed_estimates, deepspeed_extras, model_state_bytes,
                                     side_by_side)


@pytest.mark.parametrize("key", sorted(RECORDED))
def test_deepspeed_answers_what_we_recorded_and_we_explain_it(key):
    psi, largest, gpn, nodes = key
    live = deepspeed_estimates(psi, largest, gpn, nodes)
    assert live == RECORDED[key]
    rows = side_by_side(psi, largest, gpn, nodes)
    assert [r["explained"] for r in rows] == list(live)
    assert [r["deepspeed"] for r in rows] == list(live)


def test_explained_on_inputs_never_recorded():
    for psi, largest, gpn, nodes in ((123_456_789, 1_000_003, 4, 3), (10**9, 10**7, 8, 16)):
        rows = side_by_side(psi, largest, gpn, nodes)
        assert [r["explained"] for r in rows] == list(deepspeed_estimates(psi, largest, gpn, nodes))
        assert all(r["deepspeed"] is None for r in rows)


def test_the_extras_are_what_the_paper_leaves_out():
    psi, n = 7.5e9, 64
    extras = deepspeed_extras(int(psi), 2**26, n)
    assert sum(extras[2].values()) == 4 * psi / n
    assert model_state_bytes(psi, n, 2) + sum(extras[2].values()) == 2 * psi + 18 * psi / n
    assert model_state_bytes(psi, n, 3) + sum(extras[3].values()) == 18 * psi / n + 4 * 2**26


def test_bad_input_refused():
    with pytest.raises(ValueError, match="nodes"):
        side_by_side(10**9, 10**6, 8, 0)
