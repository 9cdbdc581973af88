"""The tensor-parallel step figures draw sums the way notebook 00 does (issue 35): a partial sum
hatched and titled against its own term, a complete sum (an all-reduce's output) with one band of
each rank's colour; and fc2's tall W2 gets a taller row in the overview instead of a sliver."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from mtb_helpers.check import check_tp_mlp  # noqa: E402
from mtb_helpers.plots.palette import rank_color  # noqa: E402
from mtb_helpers.tp.plots import plot_step, plot_steps  # noqa: E402


def _colours(ax) -> set:
    return {matplotlib.colors.to_hex(p.get_facecolor()) for p in ax.patches if p.get_fill()}


def test_summed_cells_show_every_rank_and_partials_are_compared_with_their_term():
    report = check_tp_mlp(world_size=3, hidden=6, ffn_hidden=12, batch_shape=(2,))
    ranks = {matplotlib.colors.to_hex(rank_color(r)) for r in range(3)}
    summed = plot_step(report, "all-reduce (g forward)")
    assert all(ranks <= _colours(ax) for ax in summed.axes)            # bands of all three colours
    partial = plot_step(report, "fc2 local matmul")
    for r, ax in enumerate(partial.axes):
        assert _colours(ax) & ranks == {matplotlib.colors.to_hex(rank_color(r))}   # its own colour only
        assert ax.get_title().endswith("vs its term")
    plain = plot_step(report, "add b2 once")                            # no collective: one colour
    assert all(len(_colours(ax) & ranks) == 1 for ax in plain.axes)
    plt.close("all")


def test_a_tall_weight_gets_a_taller_row():
    report = check_tp_mlp(world_size=2, hidden=8, ffn_hidden=32, batch_shape=(2, 3))
    fig = plot_steps(report, steps=["shard W1 by columns", "shard W2 by rows"])
    # the black outline of each panel, step by step and rank by rank, in inches (the one Axes
    # spans the figure with inches as data units)
    w1, _, w2, _ = [p for p in fig.axes[0].patches if not p.get_fill()
                    and matplotlib.colors.same_color(p.get_edgecolor(), "black")]
    assert w2.get_height() > 2 * w1.get_height() and w2.get_width() > 0.5   # W2's 8 columns
    plt.close("all")
