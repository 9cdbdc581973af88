"""The context-parallel explorers re-run the check on real ranks when a control changes."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from mtb_helpers.cp.widget import explore_balance, explore_context_parallel  # noqa: E402


def test_explorer_redraws_and_offers_the_variants_bugs(capsys):
    explorer = explore_context_parallel(world_size=2)
    assert "PASS: ring, contiguous, causal, bug=None" in capsys.readouterr().out
    (size, variant, layout), (causal, bug) = (row.children for row in explorer.children[:2])
    assert bug.value == "none" and "cp-no-rescale" in bug.options
    bug.value = "cp-grads-not-sent-home"
    assert "FAIL (k_grad, v_grad)" in capsys.readouterr().out
    variant.value = "allgather"          # the ring's bug does not apply: back to none
    assert bug.value == "none" and "cp-zigzag-wrong-order" in bug.options
    assert "PASS: allgather" in capsys.readouterr().out
    layout.value = "zigzag"
    bug.value = "cp-zigzag-wrong-order"
    assert "FAIL (k_grad, output, q_grad, v_grad)" in capsys.readouterr().out
    causal.value = False
    assert "FAIL (k_grad, v_grad)" in capsys.readouterr().out


def test_balance_explorer_follows_the_slider(capsys):
    explorer = explore_balance(world_size=2)
    assert "contiguous [144, 288], zigzag [180, 180]" in capsys.readouterr().out
    explorer.children[0].children[0].value = 3
    assert "contiguous [64, 128, 192], zigzag [112, 112, 112]" in capsys.readouterr().out
