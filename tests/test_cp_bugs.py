"""Each deliberate context-parallel bug fails exactly the (quantity, rank) rows it breaks,
derived from what it does; where it has nothing to break (one rank, no mask, the contiguous
layout) the check refuses it, naming what it needs, before any rank starts."""
from __future__ import annotations

import itertools

import pytest
import torch

from mtb_helpers import BUGS
from mtb_helpers.check import check_context_parallel
from mtb_helpers.checking.bug import names_for
from mtb_helpers.cp.bugs import BUGS as CP_BUGS

ALL = ("output", "q_grad", "k_grad", "v_grad")


def _rows(quantities, ranks) -> set[tuple[str, int]]:
    return {(q, r) for q in quantities for r in ranks}


def can_show(bug: str, layout: str, causal: bool, t: int) -> bool:
    """Where each bug has something to break, written out from what it does (not from its needs)."""
    if bug == "cp-no-rescale":
        return t > 1 or layout == "zigzag"   # some query folds in more than one key block
    if bug == "cp-local-causal-mask":
        return causal and t > 1              # a mask, and local numbers that differ from global
    if bug == "cp-zigzag-wrong-order":
        return layout == "zigzag" and t > 1  # rank order differs from position order
    return t > 1                             # a hop home, a reduce-scatter over other ranks


def expected(bug: str, variant: str, layout: str, causal: bool, t: int) -> set:
    everyone = range(t)
    if bug == "cp-no-rescale":
        # a rank whose queries fold in more than one chunk pair mixes scales: output wrong, and
        # with it rowsum(dO * O) in every dS, so dQ there and dK of every block it attended to;
        # dV = P^T dO needs only P, rebuilt from the (right) lse
        if layout == "contiguous":
            several = range(1, t) if causal else everyone
            return _rows(("output", "q_grad"), several) | _rows(("k_grad",), everyone)
        return _rows(("output", "q_grad", "k_grad"), everyone)
    if bug == "cp-local-causal-mask":
        if variant == "allgather" and layout == "contiguous":
            # rank 0's local query numbers are its global ones; every rank's keys are misjudged
            return _rows(("output", "q_grad"), range(1, t)) | _rows(("k_grad", "v_grad"), everyone)
        return _rows(ALL, everyone)
    if bug == "cp-zigzag-wrong-order":
        # without a mask attention does not care where a key sits, but the grads go back to
        # the wrong positions; with one, every query sees the wrong keys
        return _rows(ALL if causal else ("k_grad", "v_grad"), everyone)
    if bug == "cp-grads-not-sent-home":
        return _rows(("k_grad", "v_grad"), everyone)
    if bug == "cp-allgather-no-reduce-scatter":
        if causal and layout == "contiguous":
            # the last rank's keys are seen by its own queries only, so its slice is complete
            return _rows(("k_grad", "v_grad"), range(t - 1))
        return _rows(("k_grad", "v_grad"), everyone)
    raise AssertionError(bug)


CASES = [(bug, check[len("cp-"):]) for bug, b in CP_BUGS.items() for check in b.checks]
SETTINGS = list(itertools.product(("contiguous", "zigzag"), (False, True), (1, 2, 3, 4)))


def test_every_cp_bug_is_registered_and_described():
    assert set(CP_BUGS) <= set(BUGS) and all(BUGS[b] for b in CP_BUGS)
    assert set(names_for(CP_BUGS, "cp-ring")) == {"cp-no-rescale", "cp-local-causal-mask",
                                        "cp-grads-not-sent-home"}
    assert set(names_for(CP_BUGS, "cp-allgather")) == {"cp-local-causal-mask", "cp-zigzag-wrong-order",
                                             "cp-allgather-no-reduce-scatter"}


@pytest.mark.parametrize("bug, variant", CASES)
def test_the_needs_are_exactly_where_the_bug_has_something_to_break(no_ranks, bug, variant):
    for layout, causal, t in SETTINGS:
        shows = not CP_BUGS[bug].unmet(world_size=t, causal=causal, layout=layout)
        assert shows == can_show(bug, layout, causal, t), (layout, causal, t)
        assert (bug in names_for(CP_BUGS, f"cp-{variant}", world_size=t, causal=causal, layout=layout)) == shows


@pytest.mark.parametrize("bug, kwargs, condition", [
    ("cp-local-causal-mask", dict(world_size=4, causal=False), "a causal mask"),
    ("cp-local-causal-mask", dict(world_size=1, causal=True), "2 or more ranks"),
    ("cp-zigzag-wrong-order", dict(world_size=4, variant="allgather", layout="contiguous"),
     "the zigzag layout"),
    ("cp-zigzag-wrong-order", dict(world_size=1, variant="allgather", layout="zigzag"),
     "2 or more ranks"),
    ("cp-no-rescale", dict(world_size=1, layout="contiguous"), "2 or more ranks or the zigzag layout"),
    ("cp-grads-not-sent-home", dict(world_size=1), "2 or more ranks"),
    ("cp-allgather-no-reduce-scatter", dict(world_size=1, variant="allgather"), "2 or more ranks"),
])
def test_each_need_is_refused_naming_the_condition(no_ranks, bug, kwargs, condition):
    with pytest.raises(ValueError, match=f"bug {bug!r} cannot show here: it needs .*{condition}"):
        check_context_parallel(seq=16, bug=bug, **kwargs)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bug, variant", CASES)
def test_bug_fails_exactly_what_it_breaks_or_is_refused(bug, variant, causal, layout):
    for t in (1, 3):
        kwargs = dict(world_size=t, seq=12, heads=2, head_dim=4, causal=causal, variant=variant,
                      layout=layout, dtype=torch.float64, bug=bug)
        if not can_show(bug, layout, causal, t):
            with pytest.raises(ValueError, match="cannot show here"):
                check_context_parallel(**kwargs)
            continue
        report = check_context_parallel(**kwargs)
        failed = {(r.quantity, r.rank) for r in report.failed()}
        assert failed and failed == expected(bug, variant, layout, causal, t), str(report)
        assert report.config["bug"] == bug


def test_the_four_issue_bugs_each_fail_somewhere_at_two_ranks():
    for bug, variant, layout in [("cp-no-rescale", "ring", "contiguous"),
                                 ("cp-local-causal-mask", "ring", "contiguous"),
                                 ("cp-zigzag-wrong-order", "allgather", "zigzag"),
                                 ("cp-grads-not-sent-home", "ring", "zigzag")]:
        report = check_context_parallel(world_size=2, seq=8, causal=True, variant=variant,
                                        layout=layout, dtype=torch.float32, bug=bug)
        assert not report.passed, bug


def test_missing_last_hop_shows_in_the_bytes():
    report = check_context_parallel(world_size=3, seq=12, variant="ring", dtype=torch.float64,
                                    bug="cp-grads-not-sent-home")
    cp = report.extra["cp"]
    n = cp["bytes"]["shard_bytes"]
    assert cp["bytes"]["backward"] == [cp["bytes"]["formula"]["backward"] - 2 * n] * 3
    assert not cp["bytes"]["matches_formula"]
    assert report.records[0].count("send", "backward") == 2
