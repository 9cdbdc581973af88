"""The α-β model against cases worked by hand (Thakur, Rabenseifner & Gropp 2005) and nccl-tests'
algbw/busbw definitions. Link(α = 10 µs, β = 1 GB/s) and n = 4 MB throughout unless said:
n/β = 4 ms, so each case is a few additions one can check on paper."""
from __future__ import annotations

import dataclasses
import math

import pytest

from mtb_helpers.cost import (ALGORITHMS, COLLECTIVES, Link, algbw, busbw, coefficients, n_half,
                              normalize, predict)

LINK = Link(alpha=1e-5, bandwidth=1e9)
N = 4_000_000          # n/β = 4e-3 s
A, NB = 1e-5, 4e-3


@pytest.mark.parametrize("collective, p, algorithm, expected", [
    # ring all-reduce: reduce-scatter (p-1 steps of n/p) then all-gather (p-1 steps of n/p)
    ("all-reduce", 4, "ring", 6 * A + 6 / 4 * NB),
    ("all-reduce", 2, "ring", 2 * A + 1 * NB),
    ("all-reduce", 3, "ring", 4 * A + 4 / 3 * NB),
    # recursive halving (lg p steps: n/2, n/4) then doubling (n/4, n/2): 2 lg p α + 2(p-1)/p n/β
    ("all-reduce", 4, "halving-doubling", 4 * A + 1.5 * NB),
    ("all-reduce", 8, "halving-doubling", 6 * A + 1.75 * NB),
    # p = 3: rank 2 folds its vector into rank 0 (α + n/β), ranks 0 and 1 halve (α + n/2β) and
    # double (α + n/2β), rank 0 sends rank 2 the result (α + n/β)
    ("all-reduce", 3, "halving-doubling", 4 * A + 3 * NB),
    # naive: rank 0 receives 3 whole vectors one after another, then sends 3
    ("all-reduce", 4, "naive", 6 * A + 6 * NB),
    # van de Geijn broadcast: binomial scatter (lg p α + (p-1)/p n/β) + ring all-gather
    ("broadcast", 4, "ring", (2 + 3) * A + 1.5 * NB),
    ("broadcast", 4, "tree", 2 * A + 2 * NB),      # binomial: lg p rounds of the whole message
    ("broadcast", 3, "tree", 2 * A + 2 * NB),      # ⌈lg 3⌉ = 2 rounds
    ("broadcast", 4, "naive", 3 * A + 3 * NB),
    ("all-gather", 4, "ring", 3 * A + 0.75 * NB),  # n = the gathered output, 1 MB per rank
    ("all-gather", 4, "doubling", 2 * A + 0.75 * NB),  # recursive doubling: 1 MB then 2 MB
    ("all-gather", 3, "doubling", 2 * A + 2 / 3 * NB),  # Bruck: ⌈lg 3⌉ rounds, still (p-1)/p n
    ("reduce-scatter", 4, "ring", 3 * A + 0.75 * NB),
    ("reduce-scatter", 4, "halving", 2 * A + 0.75 * NB),  # recursive halving: 2 MB then 1 MB
    ("all-to-all", 4, "ring", 3 * A + 0.75 * NB),  # pairwise: 3 steps of n/4 each
    ("send/recv", 2, "ring", A + NB),
    ("send/recv", 8, "ring", A + NB),              # one message, whatever the group size
])
def test_hand_worked_cases(collective, p, algorithm, expected):
    assert predict(collective, N, p, LINK, algorithm) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("collective", [c for c in COLLECTIVES if c != "send/recv"])
def test_one_rank_sends_nothing_and_takes_no_time(collective):
    for algorithm in ALGORITHMS[collective]:
        assert predict(collective, N, 1, LINK, algorithm) == 0.0


def test_the_naive_all_reduce_loses_by_a_factor_that_grows_with_p():
    big = 10**12   # bandwidth-bound: the ratio tends to p
    ratios = [predict("all-reduce", big, p, LINK, "naive") / predict("all-reduce", big, p, LINK)
              for p in (2, 4, 8)]
    assert ratios == pytest.approx([2, 4, 8], rel=1e-6)


def test_halving_doubling_never_loses_to_the_ring_at_a_power_of_two():
    """The same bytes in fewer messages: at p = 2^k it is never slower, whatever the size (MPICH
    runs it for long messages). Only the fold of a p that is not a power of two costs bytes."""
    for p in (2, 4, 8, 16, 64):
        for n in (8, 10**3, 10**6, 10**9, 10**12):
            hd, ring = (predict("all-reduce", n, p, LINK, a) for a in ("halving-doubling", "ring"))
            assert hd <= ring * (1 + 1e-12), (p, n)
    assert predict("all-reduce", 8, 8, LINK, "halving-doubling") < predict("all-reduce", 8, 8, LINK) / 2
    big = 10**12
    assert predict("all-reduce", big, 3, LINK, "halving-doubling") > 2 * predict("all-reduce", big, 3, LINK)


def test_busbw_tends_to_beta_for_the_rings_but_not_for_this_broadcast():
    """busbw undoes the ring's fraction b for all-reduce, all-gather, reduce-scatter and all-to-all;
    the scatter + all-gather broadcast moves 2(p-1)/p n while nccl-tests' factor is 1."""
    big = 10**13
    for p in (2, 3, 4, 8):
        for collective in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all"):
            t = predict(collective, big, p, LINK)
            assert busbw(collective, big, t, p) == pytest.approx(LINK.bandwidth, rel=1e-6)
        t = predict("broadcast", big, p, LINK)
        assert busbw("broadcast", big, t, p) == pytest.approx(LINK.bandwidth * p / (2 * (p - 1)),
                                                              rel=1e-6)


def test_nccl_tests_algbw_and_busbw():
    # a 1 GiB all-reduce on 8 ranks in 10 ms: algbw = S/t, busbw = algbw x 2(n-1)/n
    s = 2**30
    assert algbw(s, 0.01) == pytest.approx(1.073741824e11)
    assert busbw("all-reduce", s, 0.01, 8) == pytest.approx(1.073741824e11 * 14 / 8)
    assert busbw("all_gather", s, 0.01, 8) == pytest.approx(1.073741824e11 * 7 / 8)
    assert busbw("reduce-scatter", s, 0.01, 4) == pytest.approx(1.073741824e11 * 3 / 4)
    assert busbw("all-to-all", s, 0.01, 2) == pytest.approx(1.073741824e11 / 2)
    assert busbw("broadcast", s, 0.01, 8) == pytest.approx(1.073741824e11)
    assert busbw("send", s, 0.01, 2) == pytest.approx(1.073741824e11)


@pytest.mark.parametrize("collective", ["all-reduce", "all-gather", "reduce-scatter", "all-to-all"])
def test_busbw_of_a_ring_prediction_is_the_link_bandwidth_for_large_sizes(collective):
    # the reason nccl-tests defines busbw: independent of p, it tends to the hardware's β
    for p in (2, 3, 4, 8):
        n = 10**13
        t = predict(collective, n, p, LINK)
        assert busbw(collective, n, t, p) == pytest.approx(LINK.bandwidth, rel=1e-6)


def test_n_half_is_where_latency_and_bandwidth_terms_meet():
    assert LINK.n_half == pytest.approx(1e4)                  # α·β = 10 µs x 1 GB/s = 10 kB
    assert n_half("send/recv", 2, LINK) == pytest.approx(1e4)
    assert n_half("all-reduce", 4, LINK) == pytest.approx(4e4)  # p·α·β for the ring all-reduce
    a, b = coefficients("all-reduce", 4)
    n = n_half("all-reduce", 4, LINK)
    assert a * LINK.alpha == pytest.approx(b * n / LINK.bandwidth)
    assert math.isinf(n_half("all-reduce", 1, LINK))


def test_spellings_of_torch_and_the_records_are_understood():
    assert normalize("all_reduce") == normalize("allreduce") == "all-reduce"
    assert normalize("reduce_scatter") == "reduce-scatter"
    assert normalize("all_to_all") == "all-to-all"
    assert normalize("send") == normalize("recv") == "send/recv"
    assert predict("all_gather", N, 4, LINK) == predict("all-gather", N, 4, LINK)


def test_link_describes_itself_and_is_frozen():
    assert Link(5e-6, 50e9).describe() == "α = 5 µs, β = 50 GB/s"
    with pytest.raises(dataclasses.FrozenInstanceError):
        LINK.alpha = 1.0


@pytest.mark.parametrize("alpha, bandwidth, name", [
    (0.0, 1e9, "alpha"), (-1e-6, 1e9, "alpha"), (math.nan, 1e9, "alpha"), (math.inf, 1e9, "alpha"),
    (True, 1e9, "alpha"), ("5us", 1e9, "alpha"),
    (1e-6, 0, "bandwidth"), (1e-6, -5.0, "bandwidth"), (1e-6, math.inf, "bandwidth"),
    (1e-6, math.nan, "bandwidth"), (1e-6, None, "bandwidth")])
def test_bad_links_are_refused_naming_the_field(alpha, bandwidth, name):
    with pytest.raises(ValueError, match=name):
        Link(alpha, bandwidth)


@pytest.mark.parametrize("call, match", [
    (lambda: predict("all-sum", N, 4, LINK), "unknown collective 'all-sum'"),
    (lambda: predict("all-to-all", N, 4, LINK, "tree"), "unknown algorithm 'tree' for all-to-all"),
    (lambda: predict("all-reduce", N, 4, LINK, "butterfly"),
     "expected one of ring, halving-doubling, naive"),
    # the old name of halving-doubling: NCCL's "tree" is another algorithm, so it is refused
    (lambda: predict("all-reduce", N, 4, LINK, "tree"), "unknown algorithm 'tree' for all-reduce"),
    (lambda: predict("all-reduce", N, 0, LINK), "world_size"),
    (lambda: predict("all-reduce", N, 2.0, LINK), "world_size"),
    (lambda: predict("send/recv", N, 1, LINK), "send/recv needs world_size >= 2"),
    (lambda: predict("all-reduce", -1, 4, LINK), "nbytes"),
    (lambda: predict("all-reduce", math.nan, 4, LINK), "nbytes"),
    (lambda: predict("all-reduce", N, 4, (1e-5, 1e9)), "link must be a Link"),
    (lambda: algbw(N, 0.0), "seconds"),
])
def test_bad_arguments_are_refused_with_a_clear_message(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_a_step_is_predicted_from_its_record_event_by_event():
    from mtb_helpers.comm.records import CollectiveEvent, CollectiveRecord
    from mtb_helpers.cost.step import predict_step_time

    def ev(op, nbytes, t=4):
        return CollectiveEvent(op, "r", "", "forward", (1,), (1,), "float32", nbytes, 0, t)
    rank0 = CollectiveRecord([ev("all_gather", 1000), ev("split", 4000), ev("all_reduce", N),
                              ev("send", 2000), ev("recv", 2000), ev("all_to_all", 800)])
    rank1 = CollectiveRecord([ev("all_gather", 1000), ev("split", 4000), ev("all_reduce", N),
                              ev("send", 2000), ev("recv", 2000), ev("all_to_all", 4000)])
    expected = (3 * A + 0.75 * 4000 / 1e9          # all-gather: S = 4 x 1000 B, the output
                + 6 * A + 1.5 * NB                 # all-reduce of 4 MB
                + A + 2000 / 1e9                   # one message; its recv overlaps (full duplex)
                + 3 * A + 0.75 * 4000 / 1e9)       # all-to-all: the larger send buffer (rank 1)
    assert predict_step_time([rank0, rank1], LINK, compute=0.5) == pytest.approx(0.5 + expected)
    with pytest.raises(ValueError, match="differ in length"):
        predict_step_time([rank0, CollectiveRecord([ev("all_reduce", 8)])], LINK)


def test_a_pipeline_step_is_the_simulators_makespan_with_alpha_beta_messages():
    from mtb_helpers.cost.step import predict_pipeline_step_time
    from mtb_helpers.pp import schedule, simulate

    t = predict_pipeline_step_time("gpipe", 2, 2, (1.0, 2.0), 10**9, LINK)
    # GPipe, 2 stages, 2 micro-batches; every hop between the stages takes α + 1 GB/β
    ops = schedule("gpipe", 2, 2)
    assert t == pytest.approx(simulate(ops, 1.0, 2.0, latency=A + 1.0).makespan)
    assert t > simulate(ops, 1.0, 2.0).makespan + 2 * (A + 1.0) - 1e-9   # two hops on the path
