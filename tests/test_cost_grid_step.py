"""The capstone's step predicted from what its ranks send (``predict_grid_step_time``), worked by
hand on a 2-stage 1F1B pipeline of 2 micro-batches, and the simulator's per-stage op times it
rests on. Arithmetic only: no rank starts, no timing."""
from __future__ import annotations

import pytest

from mtb_helpers.comm.records import CollectiveEvent, CollectiveRecord
from mtb_helpers.cost import Link
from mtb_helpers.cost.step import op_comm_time, predict_grid_step_time
from mtb_helpers.pp import schedule, simulate

LINK = Link(alpha=0.01, bandwidth=1e3)     # 100 bytes: 0.1 s on the wire


def ev(op: str, nbytes: int, region: str = "layer") -> CollectiveEvent:
    return CollectiveEvent(op, region, "", "forward", (nbytes,), (nbytes,), "uint8", nbytes, 0, 2)


def rec(*events: CollectiveEvent) -> CollectiveRecord:
    return CollectiveRecord(list(events))


AR = ev("all_reduce", 100)                  # ring, p = 2: 2 α + n / β = 0.12 s
SEND = ev("send", 50, "activation -> rank 1")   # the pipeline's: the simulator's latency, 0.06 s
HOP = (ev("send", 30, "cp.kv"), ev("recv", 30, "cp.kv"))   # a ring hop: once, 0.04 s


def test_an_op_pays_its_collectives_and_ring_hops_not_the_pipelines_messages():
    assert op_comm_time(rec(AR, SEND, ev("recv", 50, "input grad <- rank 1"), *HOP), LINK) == \
        pytest.approx(0.12 + 0.04)


def test_grid_step_by_hand():
    # stage 0: F pays one all-reduce (the embedding's), B one; stage 1: F two (the loss's),
    # B one and a ring hop. A second rank on each stage sends less: the slowest rank counts.
    def stage(s, f, b, after):
        return {"stage": s, "F": [rec(*f, SEND)] * 2, "B": [rec(*b)] * 2, "after": rec(after)}
    ranks = [stage(0, [AR], [AR], ev("all_reduce", 200)), stage(0, [], [], ev("all_reduce", 200)),
             stage(1, [AR, AR], [AR, *HOP], ev("all_reduce", 400)),
             stage(1, [AR], [], ev("all_reduce", 400))]
    # F = (1.12, 1.24), B = (2.12, 2.16), messages 0.06; 1F1B orders stage 0 F0 F1 B0 B1 and
    # stage 1 F0 B0 F1 B1:
    #   s0 F0 0-1.12, F1 1.12-2.24 | s1 F0 1.18-2.42, B0 2.42-4.58 | s0 B0 4.64-6.76
    #   s1 F1 4.58-5.82, B1 5.82-7.98 | s0 B1 8.04-10.16
    # then each stage's optimizer (0.05) and gradient all-reduce: 200 B 0.22 s, 400 B 0.42 s
    step = predict_grid_step_time(ranks, [(1.0, 2.0), (1.0, 2.0)], LINK, after_compute=0.05)
    assert step == pytest.approx(max(10.16 + 0.05 + 0.22, 7.98 + 0.05 + 0.42))


def test_grid_step_refuses_what_does_not_fit():
    one = {"stage": 0, "F": [rec()], "B": [rec()], "after": rec()}
    with pytest.raises(ValueError, match="2 stages"):
        predict_grid_step_time([one, {**one, "stage": 1}], [(1.0, 2.0)], LINK)
    with pytest.raises(ValueError, match="numbers of ops"):
        predict_grid_step_time([one, {**one, "F": [rec()] * 2}], [(1.0, 2.0)], LINK)


def test_simulator_takes_one_op_time_per_stage():
    ops = schedule("1f1b", 4, 8)
    uniform = simulate(ops, 1.0, 2.0, latency=0.1)
    assert simulate(ops, [1.0] * 4, [2.0] * 4, latency=0.1).makespan == uniform.makespan
    # a heavier last stage (its loss): its 8 forwards and backwards are the critical path,
    # plus the fill before it (3 forwards) and the drain after it (3 backwards)
    heavy = simulate(ops, [1.0, 1.0, 1.0, 1.5], [2.0, 2.0, 2.0, 3.0])
    assert heavy.makespan == pytest.approx(3 * 1.0 + 8 * (1.5 + 3.0) + 3 * 2.0)
    with pytest.raises(ValueError, match="one per rank"):
        simulate(ops, [1.0] * 3, 2.0)
    with pytest.raises(ValueError, match="no input/weight split"):
        simulate(schedule("zb-h1", 4, 8), [1.0] * 4, 2.0, input=1.0)
