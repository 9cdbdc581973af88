"""The context-parallel explorers re-run the check on real ranks when a control changes."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from mtb_helpers.cp.check import check_context_parallel, check_layouts  # noqa: E402
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
    assert bug.value == "none" and "PASS: allgather" in _shown(explorer)
    layout.value = "zigzag"
    bug.value = "cp-zigzag-wrong-order"
    assert "FAIL (k_grad, output, q_grad, v_grad)" in _shown(explorer)
    causal.value = False                 # the wrong order still shows: the choice is kept
    assert bug.value == "cp-zigzag-wrong-order" and "FAIL (k_grad, v_grad)" in _shown(explorer)


def test_the_bug_list_offers_only_what_can_show_under_the_other_controls():
    explorer = explore_context_parallel(world_size=2)
    (size, variant, layout), (causal, bug) = (row.children for row in explorer.children[:2])
    variant.value = "allgather"
    assert bug.options == ("none", "cp-local-causal-mask", "cp-allgather-no-reduce-scatter")
    layout.value = "zigzag"              # now rank order is not position order
    assert bug.options == ("none", "cp-local-causal-mask", "cp-zigzag-wrong-order",
                           "cp-allgather-no-reduce-scatter")
    bug.value = "cp-local-causal-mask"
    assert "FAIL" in _shown(explorer)
    causal.value = False                 # no mask: the local mask has nothing to break
    assert "cp-local-causal-mask" not in bug.options and bug.value == "none"
    assert "PASS: allgather, zigzag, no mask, bug=None" in _shown(explorer)
    size.value = 1                       # one rank: nothing moves, no bug can show
    assert bug.options == ("none",)
    variant.value = "ring"               # ... except a missing rescale over zigzag's two chunks
    assert bug.options == ("none", "cp-no-rescale")
    bug.value = "cp-no-rescale"
    assert "FAIL" in _shown(explorer)


def test_balance_explorer_follows_the_slider():
    explorer = explore_balance(world_size=2)
    assert "contiguous [144, 288], zigzag [180, 180]" in _shown(explorer)
    explorer.children[0].children[0].value = 3
    assert "contiguous [64, 128, 192], zigzag [112, 112, 112]" in _shown(explorer)
    # every move runs the real check and shows its verdict
    assert "check against one process: contiguous PASS, zigzag PASS" in _shown(explorer)


@pytest.mark.parametrize("variant, bug", [("ring", None), ("ring", "cp-no-rescale"),
                                          ("ring", "cp-grads-not-sent-home"),
                                          ("ring", "cp-local-causal-mask"),
                                          ("allgather", "cp-local-causal-mask")])
def test_both_layouts_in_one_call_give_the_reports_of_two_calls(variant, bug):
    """The balance explorer's one call to the ranks: each layout's verdict, errors, work, bytes
    and records are those of a call of its own."""
    both = check_layouts(world_size=4, seq=24, causal=True, variant=variant,
                         layouts=("contiguous", "zigzag"), dtype="float64", bug=bug)
    assert list(both) == ["contiguous", "zigzag"]
    for layout, report in both.items():
        alone = check_context_parallel(world_size=4, seq=24, causal=True, variant=variant,
                                       layout=layout, dtype="float64", bug=bug)
        assert report.passed == alone.passed == (bug is None)
        assert report.config == alone.config and report.rows == alone.rows
        assert report.extra == alone.extra
        assert [r.events for r in report.records] == [r.events for r in alone.records]


def _rounds(variant, layouts) -> dict[str, int]:
    """On a rank: the point-to-point messages and collectives one check call sends, by kind."""
    import torch
    import torch.distributed as dist

    from mtb_helpers.cp import check

    counts: dict[str, int] = {}
    kinds = ("isend", "irecv", "all_gather", "all_reduce", "reduce_scatter_tensor",
             "reduce_scatter_single", "barrier", "broadcast")
    real = {name: getattr(dist, name) for name in kinds if hasattr(dist, name)}

    def counted(name, fn):
        def op(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return fn(*args, **kwargs)
        return op

    for name, fn in real.items():
        setattr(dist, name, counted(name, fn))
    # the shape agreement calls torch's own all-gather (comm.mesh.agree), outside every record
    from mtb_helpers.runtime.link_ops import ORIG
    plain = ORIG["all_gather"]
    ORIG["all_gather"] = counted("all_gather", plain)
    try:
        check._on_rank(check.VARIANTS[variant], (1, 2, 8, 4), torch.float64, 0, True, layouts)
    finally:
        ORIG["all_gather"] = plain
        for name, fn in real.items():
            setattr(dist, name, fn)
    return counts


@pytest.mark.parametrize("t", [2, 4])
def test_both_layouts_cost_the_sync_rounds_of_one(t):
    """The balance explorer's call: one shape agreement for both layouts, and the two rings in
    lockstep, each hop one message carrying both layouts' blocks (t-1 forward, t-1 backward, 1
    home), as many rounds as one layout alone."""
    from mtb_helpers import run
    one, both = (run(_rounds, "ring", layouts, world_size=t)
                 for layouts in (("contiguous",), ("contiguous", "zigzag")))
    want = {"all_gather": 1, "isend": 2 * t - 1, "irecv": 2 * t - 1}
    assert one == both == [want] * t, (one, both)


def test_every_figure_has_a_title_axis_labels_and_a_legend():
    import torch

    from mtb_helpers.check import check_context_parallel
    from mtb_helpers.cp.plots import plot_cost, plot_layout, plot_ring_steps, plot_work
    from mtb_helpers.plots.errors import plot_errors
    from mtb_helpers.plots.palette import rank_color

    report = check_context_parallel(world_size=3, seq=12, causal=True, dtype=torch.float64)
    cp = report.extra["cp"]
    figures = [plot_layout({"contiguous": cp["positions"]}), plot_ring_steps(cp),
               plot_work({"contiguous": cp["work"]["forward"]}),
               plot_cost({"ring": {"cp": [1, 2], "sent": [0, 1], "kv": [1, 2]}}),
               plot_errors(report, by="quantity")]
    for fig in figures:
        for ax in fig.axes:
            assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
        assert any(ax.get_legend() for ax in fig.axes)
    # rank r's block is drawn in rank r's colour: rank 2 holds its own block at step 0
    cell = [p for p in figures[1].axes[0].patches][2 * 3]
    assert matplotlib.colors.to_hex(cell.get_facecolor()) == rank_color(2).lower()
