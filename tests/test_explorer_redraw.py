"""benchmarks/explorer_redraw.py's rounds, without kernels: the trees' timed moves alternate in
swapped pairs (so a drifting machine slows both alike), every kernel is closed, a failure names its
tree, and the summary pools the rounds."""
from __future__ import annotations

import pytest

from tests.load_scripts import load_script


@pytest.fixture
def bench():
    return load_script("benchmarks/explorer_redraw.py")


def fake_kernels(log: list, fail_on: str | None = None):
    class FakeKernel:
        def __init__(self, name, tree, warm, profile):
            self.tree, self.profile, self.times = tree, profile, []
            log.append(("start", tree))

        def build(self):
            self.first, self.new = 1.0, 0.5
            log.append(("build", self.tree))

        def move(self):
            if self.tree == fail_on:
                raise ValueError("the redraw showed 0 figure(s)")
            log.append(("move", self.tree))
            self.times.append(0.1 if self.tree == "before" else 0.03)

        def close(self):
            log.append(("close", self.tree))
    return FakeKernel


def test_the_trees_moves_alternate_in_swapped_pairs(bench, monkeypatch):
    log = []
    monkeypatch.setattr(bench, "Kernel", fake_kernels(log))
    before, now = bench.measure_round("tp-mlp", 4, False, ["before", "now"])
    assert log[:4] == [("start", "before"), ("build", "before"), ("start", "now"), ("build", "now")]
    assert [tree for kind, tree in log if kind == "move"] == ["before", "now", "now", "before",
                                                             "before", "now", "now", "before"]
    assert log[-2:] == [("close", "before"), ("close", "now")]
    assert before["times"] == [0.1] * 4 and now["times"] == [0.03] * 4 and now["first_ms"] == 1000


def test_a_failed_move_names_its_tree_and_closes_every_kernel(bench, monkeypatch):
    log = []
    monkeypatch.setattr(bench, "Kernel", fake_kernels(log, fail_on="now"))
    with pytest.raises(RuntimeError, match="in now: the redraw showed 0 figure"):
        bench.measure_round("tp-mlp", 2, False, ["before", "now"])
    assert ("close", "before") in log and ("close", "now") in log


def test_the_summary_pools_every_rounds_moves(bench):
    rounds = [{"times": [0.1, 0.3], "new_ms": 5.0, "first_ms": 10.0},
              {"times": [0.2], "new_ms": 7.0, "first_ms": 30.0},
              {"times": [0.4, 0.5], "new_ms": 9.0, "first_ms": 20.0}]
    row = bench.summary(rounds)
    assert row["median_ms"] == pytest.approx(300) and row["min_ms"] == pytest.approx(100)
    assert row["max_ms"] == pytest.approx(500) and row["moves"] == 5
    assert row["new_ms"] == 7.0 and row["first_ms"] == 20.0
