"""Calibration, the send/recv all-reduce algorithms and the timeline figure.

Calibrating an emulated link must give back its α and β (the fit and the emulation checked
against each other); the ring, halving-doubling and naive all-reduces must sum exactly like dist.all_reduce
and, under a link, take what their formulas say (their code and their formulas are separate)."""
from __future__ import annotations

import time

import matplotlib
import pytest
import torch
import torch.distributed as dist

matplotlib.use("Agg")

from mtb_helpers import run  # noqa: E402
from mtb_helpers.cost import Link, calibrate, predict  # noqa: E402
from mtb_helpers.cost.algorithms import all_reduce_by  # noqa: E402
from mtb_helpers.cost.calibrate import _fit  # noqa: E402
from mtb_helpers.plots.timelines import plot_timeline  # noqa: E402

SLOW = Link(alpha=20e-3, bandwidth=10e6)


def test_the_fit_recovers_alpha_and_beta_from_exact_times():
    sizes = [1000, 10_000, 100_000, 1_000_000]
    link = Link(3e-5, 2e9)
    fit = _fit("all-reduce", 4, sizes, [predict("all-reduce", n, 4, link) for n in sizes])
    assert fit.alpha == pytest.approx(3e-5, rel=1e-9)
    assert fit.bandwidth == pytest.approx(2e9, rel=1e-9)
    assert max(map(abs, fit.residuals)) < 1e-15
    assert fit.n_half == pytest.approx(6e4)


def test_calibrating_an_emulated_link_gives_back_its_alpha_and_beta():
    cal = calibrate(2, sizes=[2**10, 2**16, 2**18], collectives=("all-reduce", "send/recv"),
                    k=3, warmup=1, link=SLOW)
    for name in ("all-reduce", "send/recv"):
        fit = cal.fits[name]
        assert fit.alpha == pytest.approx(SLOW.alpha, rel=0.15), cal.table()
        assert fit.bandwidth == pytest.approx(SLOW.bandwidth, rel=0.15), cal.table()
    assert len(cal.rows) == 6
    # the table names each collective's own crossover (2·α·β for the ring all-reduce at p = 2,
    # α·β for one message), not only α·β: the figure marks the same point
    fit = cal.fits["all-reduce"]
    assert f"its crossover n½ = {2 * fit.n_half / 1e3:.1f} kB" in cal.table()
    assert f"its crossover n½ = {cal.fits['send/recv'].n_half / 1e3:.1f} kB" in cal.table()
    assert cal.to_dict()["fits"]["all-reduce"]["alpha"] == cal.fits["all-reduce"].alpha


@pytest.mark.parametrize("kwargs, match", [
    ({"sizes": [10**13, 1000]}, "free: use smaller sizes"),
    ({"sizes": [1024]}, "at least two"),
    ({"collectives": ["all-sum"]}, "unknown collective"),
    ({"k": 0}, "k must be"),
    ({"world_size": 1, "collectives": ["send/recv"]}, "needs at least 2 ranks"),
    ({"world_size": 1, "collectives": ["all-reduce"]}, "world_size=1: a calibration needs"),
    ({"sizes": [4, 5, 6, 7], "collectives": ["all-reduce"]}, "round to 1 distinct size"),
    ({"sizes": [2, 1024]}, "less than one float32"),
    ({"sizes": [1024, 2048], "k": True}, "k must be"),
])
def test_bad_calibration_input_is_refused_before_any_rank_starts(no_ranks, kwargs, match):
    with pytest.raises(ValueError, match=match):
        calibrate(**{"world_size": 2, **kwargs})


def _by(n: int, algorithm: str):
    x = torch.arange(n, dtype=torch.float64) * (dist.get_rank() + 1)   # integers: exact sums
    ref = x.clone()
    dist.all_reduce(ref)
    dist.barrier()
    t0 = time.perf_counter()
    y = all_reduce_by(x, algorithm)
    return torch.equal(y, ref), time.perf_counter() - t0


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_halving_doubling_and_naive_sum_exactly_and_take_their_predicted_time(world_size):
    n = 1536 * world_size
    for algorithm in ("ring", "halving-doubling", "naive"):
        runs = [run(_by, n, algorithm, world_size=world_size, link=SLOW, timeout=120)
                for _ in range(2)]
        assert all(ok for results in runs for ok, _ in results), algorithm
        measured = min(max(t for _, t in results) for results in runs)   # the better of two
        model = predict("all-reduce", 8 * n, world_size, SLOW, algorithm)
        # never faster than the schedule allows. Slower by the thread hand-offs of each message,
        # which a loaded shared machine stretches to several ms (benchmarks/predict_vs_measured.py
        # measures the gap on an idle one): bounded loosely here, so a test never cries wolf
        assert model - 1e-3 <= measured <= model * 1.5 + 0.02, (algorithm, measured, model)


def test_the_naive_all_reduce_is_refused_a_bad_tensor():
    with pytest.raises(ValueError, match="unknown algorithm"):
        all_reduce_by(torch.ones(4), "butterfly")


def test_the_timeline_figure_says_the_link_is_emulated_and_how_much_slower():
    def job():
        from mtb_helpers.cost import padded
        with padded("fc1.fwd", 0.01):
            pass
        dist.all_reduce(torch.ones(100))
    results = run(job, world_size=2, link=Link(1e-4, 1e9), time_scale=40.0, timeout=60)
    fig = plot_timeline(results.timeline, title="one step")
    ax = fig.axes[0]
    assert "emulated link α = 100 µs, β = 1 GB/s, 40× slower than real time" in ax.get_title()
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "rank 0 compute", "rank 0 comm", "rank 1 compute", "rank 1 comm"]
    assert "modelled link" in ax.get_xlabel()
    # 1 compute + 1 comm box per rank at least, and nothing left of time 0 (no unexplained bands)
    assert len(ax.patches) >= 4 and all(patch.get_x() >= 0 for patch in ax.patches)


def test_the_fit_weighs_every_size_by_its_relative_error():
    # ±20 % on every size: a plain least-squares fit lets the 4 MiB row's milliseconds decide
    # (α 25 % low, β 18 % low); the relative fit, which the log-log figure shows, stays near both
    sizes = [2**10, 2**13, 2**16, 2**19, 2**22]
    noisy = [predict("all-reduce", n, 2, Link(100e-6, 1e9)) * (1 + e)
             for n, e in zip(sizes, [0.2, -0.2, 0.2, -0.2, 0.2])]
    fit = _fit("all-reduce", 2, sizes, noisy)
    assert fit.alpha == pytest.approx(100e-6, rel=0.1) and fit.bandwidth == pytest.approx(1e9, rel=0.1)
    assert max(map(abs, fit.relative)) < 0.25
