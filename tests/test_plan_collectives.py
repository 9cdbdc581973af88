"""The planner's step time counts every tensor-parallel collective the capstone pays: on real ranks,
one recorded training step of the capstone issues, per pipeline stage and micro-batch, the layers'
2 + 2 per block plus exactly the small collectives ``tp_small_collectives`` lists (the embedding's
and the LM head's, the cross-entropy's max and its fused sums), and once per step the one all-reduce of the
LayerNorm and bias grads under sequence parallelism, each of the size the planner prices. Counts
and sizes only: no timing."""
from __future__ import annotations

from collections import Counter

import pytest

from mtb_helpers.capstone.finalize import FINALIZE
from mtb_helpers.capstone.model import GPTConfig
from mtb_helpers.capstone.parallel import train_parallel
from mtb_helpers.plan import Layout, tiny_gpt
from mtb_helpers.plan.steptime import tp_small_collectives

CFG = GPTConfig(vocab=32, seq=16, hidden=32, heads=4, ffn=64, layers=4)
BATCH, MICRO, D = 8, 2, 8          # float64
NAMES = {"all_reduce": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter"}


def recorded(record, t: int) -> dict[str, Counter]:
    """The tensor group's collectives of one rank's step, per direction: (collective, S in elements)
    -> count per micro-batch, and under ``"step"`` the step's one finalize all-reduce (the
    gradients' data-parallel bucket and context parallelism's ring hops left out: they are other
    terms)."""
    out = {"forward": Counter(), "backward": Counter(), "step": Counter()}
    for e in record.communicating():
        if e.op not in NAMES or e.group_size != t or e.region == "ddp_grad_bucket":
            continue
        size = e.bytes * (t if e.op == "all_gather" else 1) // D      # nccl-tests' S
        out["step" if e.operator == FINALIZE else e.direction][(NAMES[e.op], size)] += 1
    for way in ("forward", "backward"):
        assert all(n % MICRO == 0 for n in out[way].values())
        for key in out[way]:
            out[way][key] //= MICRO
    return out


@pytest.mark.parametrize("tp,pp,cp,sp", [(2, 2, 1, True), (2, 1, 2, True), (2, 2, 1, False),
                                         (4, 1, 1, True)])
def test_planner_counts_every_tensor_parallel_collective_a_capstone_step_issues(tp, pp, cp, sp):
    run = train_parallel(tp=tp, pp=pp, cp=cp, steps=1, microbatches=MICRO, batch=BATCH, cfg=CFG,
                         sequence_parallel=sp, timeout=120)
    layout = Layout(tp, pp, 1, cp, microbatch=BATCH // MICRO, grad_accum=MICRO, zero_stage=0,
                    dtype="fp64", sequence_parallel=sp)
    small = tp_small_collectives(tiny_gpt(CFG), layout)
    act = CFG.seq // cp * (BATCH // MICRO) * CFG.hidden          # [s/c, b, h]
    blocks = CFG.layers // pp
    # each block: attention and MLP, forward and backward: an all-gather + a reduce-scatter of
    # [s/c, b, h] each under SP (both directions), an all-reduce each otherwise (forward g,
    # backward f)
    main = ([("all-gather", act, 2 * blocks), ("reduce-scatter", act, 2 * blocks)] if sp
            else [("all-reduce", act, 2 * blocks)])
    for res in run.per_rank:
        stage = res["index"]["pp"]
        want = {way: Counter() for way in ("forward", "backward", "step")}
        for way in want:
            for kind, size, n in (main if way != "step" else []) + small[stage][way]:
                want[way][(kind, size)] += n
        assert recorded(res["record"], tp) == want, f"stage {stage}"
    # the LayerNorm and bias grads (SP only): one all-reduce a step of 6 [h] per block, + the
    # final LayerNorm's 2 on the last stage
    assert [st["step"] for st in small] == ([[("all-reduce", (6 * blocks + 2 * (s == pp - 1))
                                                * CFG.hidden, 1)] for s in range(pp)] if sp
                                            else [[]] * pp)
