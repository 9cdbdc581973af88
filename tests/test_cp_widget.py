"""The context-parallel explorers re-run the check on real ranks when a control changes."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from mtb_helpers.cp.widget import explore_balance, explore_context_parallel  # noqa: E402


def _shown(explorer) -> str:
    """The texts the explorer shows now (the shared frame's HTML widgets, below the controls)."""
    import html
    return "\n".join(html.unescape(w.value) for w in explorer.children[-1].children
                     if isinstance(getattr(w, "value", None), str))


def test_explorer_redraws_and_offers_the_variants_bugs():
    explorer = explore_context_parallel(world_size=2)
    assert "PASS: ring, contiguous, causal, bug=None" in _shown(explorer)
    (size, variant, layout), (causal, bug) = (row.children for row in explorer.children[:2])
    assert bug.value == "none" and "cp-no-rescale" in bug.options
    bug.value = "cp-grads-not-sent-home"
    assert "FAIL (k_grad, v_grad)" in _shown(explorer)
    variant.value = "allgather"          # the ring's bug does not apply: back to none
    assert bug.value == "none" and "cp-zigzag-wrong-order" in bug.options
    assert "PASS: allgather" in _shown(explorer)
    layout.value = "zigzag"
    bug.value = "cp-zigzag-wrong-order"
    assert "FAIL (k_grad, output, q_grad, v_grad)" in _shown(explorer)
    causal.value = False
    assert "FAIL (k_grad, v_grad)" in _shown(explorer)


def test_balance_explorer_follows_the_slider():
    explorer = explore_balance(world_size=2)
    assert "contiguous [144, 288], zigzag [180, 180]" in _shown(explorer)
    explorer.children[0].children[0].value = 3
    assert "contiguous [64, 128, 192], zigzag [112, 112, 112]" in _shown(explorer)
    # every move runs the real check and shows its verdict
    assert "check against one process: contiguous PASS, zigzag PASS" in _shown(explorer)


def test_every_figure_has_a_title_axis_labels_and_a_legend():
    import torch

    from mtb_helpers.check import check_context_parallel
    from mtb_helpers.cp.plots import plot_cost, plot_cp_errors, plot_layout, plot_ring_steps, plot_work
    from mtb_helpers.plots.palette import rank_color

    report = check_context_parallel(world_size=3, seq=12, causal=True, dtype=torch.float64)
    cp = report.extra["cp"]
    figures = [plot_layout({"contiguous": cp["positions"]}), plot_ring_steps(cp),
               plot_work({"contiguous": cp["work"]["forward"]}),
               plot_cost({"ring": {"t": [1, 2], "sent": [0, 1], "kv": [1, 2]}}),
               plot_cp_errors(report)]
    for fig in figures:
        for ax in fig.axes:
            assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
        assert any(ax.get_legend() for ax in fig.axes)
    # rank r's block is drawn in rank r's colour: rank 2 holds its own block at step 0
    cell = [p for p in figures[1].axes[0].patches][2 * 3]
    assert matplotlib.colors.to_hex(cell.get_facecolor()) == rank_color(2).lower()
