"""``link=`` changes no result of any check: the same report, float64, with and without an
emulated link (the link changes when things finish, never what they compute)."""
from __future__ import annotations

import time

import pytest
import torch

from mtb_helpers.check import (check_context_parallel, check_data_parallel, check_moe,
                               check_sequence_parallel, check_tp_mlp)
from mtb_helpers.cost import Link

LINK = Link(alpha=20e-3, bandwidth=10e6)   # slower than gloo on a busy 2-core machine
CHECKS = {
    "tp_mlp": lambda **kw: check_tp_mlp(world_size=2, dtype=torch.float64, **kw),
    "sequence_parallel": lambda **kw: check_sequence_parallel(world_size=2, dtype=torch.float64, **kw),
    "data_parallel": lambda **kw: check_data_parallel(world_size=2, strategy="zero2",
                                                      dtype=torch.float64, **kw),
    "moe": lambda **kw: check_moe(world_size=2, top_k=2, dtype=torch.float64, **kw),
    "context_parallel": lambda **kw: check_context_parallel(world_size=2, dtype=torch.float64, **kw),
}


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_a_link_changes_no_result_of_a_check(name):
    plain = CHECKS[name]()
    t0 = time.perf_counter()
    linked = CHECKS[name](link=LINK, timeout=120)
    wall = time.perf_counter() - t0
    assert plain.passed and linked.passed
    assert plain.to_dict()["rows"] == linked.to_dict()["rows"]       # every error, bit for bit
    assert [r.events for r in plain.records] == [r.events for r in linked.records]
    # and the link was really there: each message or collective of rank 0 cost at least one α
    # (a ring pass's receive runs beside its send), and each timed one at least one α too
    ops = [e for e in linked.records[0].communicating() if e.op != "recv"]
    assert ops and wall >= len(ops) * LINK.alpha
    assert all(e.seconds >= LINK.alpha - 1e-3 for r in linked.records
               for e in r.communicating() if e.seconds is not None and e.op != "recv")
