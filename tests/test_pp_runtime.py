"""The pipeline on real ranks: every schedule against one process (fp64, 1e-12), the exact op
order of schedule() read back from the measured timeline, stashes against the simulator, the
p2p record, recompute's bytes, refusals before any rank starts, and the four deliberate bugs."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mtb_helpers import RankTimeoutError
from mtb_helpers.pp import check_pipeline, pipeline_step, schedule, simulate
from mtb_helpers.pp import runtime as pp_runtime
from mtb_helpers.pp.check import make_pipeline_model, reference_step

F64 = torch.float64

# (schedule, stages, microbatches, chunks, recompute): stages 1-4 (3 is not a power of two),
# micro-batches from 1 to 2 x stages and beyond, every schedule, recompute on and off.
CASES = [("gpipe", 1, 3, 1, False), ("gpipe", 2, 1, 1, True), ("gpipe", 3, 6, 1, False),
         ("1f1b", 2, 5, 1, True), ("1f1b", 3, 2, 1, False), ("1f1b", 4, 8, 1, False),
         ("1f1b", 4, 9, 1, True), ("interleaved", 1, 3, 2, True),   # one rank: chunks hand over in memory
         ("interleaved", 2, 4, 3, False), ("interleaved", 2, 4, 2, False), ("interleaved", 3, 6, 2, True),
         ("interleaved", 4, 8, 2, False), ("zb-h1", 2, 4, 1, False), ("zb-h1", 3, 1, 1, True),
         ("zb-h1", 4, 8, 1, False), ("zb-h1", 4, 8, 1, True)]


def data(blocks, m, width=8, dtype=F64, seed=0):
    model = make_pipeline_model(blocks, width, dtype, seed)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(2 * m, width, dtype=dtype, generator=g)
    return model, x, torch.randn(2 * m, width, dtype=dtype, generator=g)


@pytest.mark.parametrize("name,p,m,v,recompute", CASES)
def test_every_schedule_matches_one_process_and_runs_exactly_its_op_order(name, p, m, v, recompute):
    model, x, y = data(p * v, m)
    res = pipeline_step(model, x, y, F.mse_loss, name, p, m, v, recompute=recompute)
    ref_loss, ref_grads = reference_step(model, x, y)
    assert abs(res.loss - float(ref_loss)) <= 1e-12
    assert list(res.grads) == [n for n, _ in model.named_parameters()]
    for n, g in ref_grads.items():
        assert torch.allclose(res.grads[n], g, rtol=0, atol=1e-12), n
    ops = schedule(name, p, m, v if name == "interleaved" else None)
    for r in range(p):
        assert res.ops(r) == list(ops[r])          # read back from the measured timeline
    assert res.peak_stashed == simulate(ops).peak_activations


def test_check_pipeline_passes_in_both_dtypes_and_reports_the_measured_run():
    rep = check_pipeline("1f1b", stages=3, microbatches=6, dtype=F64)
    assert rep.passed and rep.quantities()[0] == "loss"
    assert all(r.max_abs_err <= 1e-12 for r in rep.rows)
    pipe = rep.extra["pipeline"]
    assert pipe["ops_match_schedule"] and pipe["peak_stashed"] == [3, 2, 1]
    assert pipe["peak_stashed"] == pipe["simulated_peak_activations"]
    assert check_pipeline("interleaved", stages=2, microbatches=4, dtype=torch.float32).passed


def test_p2p_bytes_are_recorded_per_peer():
    model, x, y = data(3, 4)
    res = pipeline_step(model, x, y, schedule="gpipe", stages=3, microbatches=4)
    act = 2 * 8 * 8   # one micro-batch [2, 8] in float64
    sent = [rec.total_bytes("send", sent=True) for rec in res.records]
    # rank 0 sends 4 activations, rank 1 4 activations and 4 grads, rank 2 4 grads
    assert sent == [4 * act, 8 * act, 4 * act]
    assert [rec.count("recv") for rec in res.records] == [4, 8, 4]
    assert res.records[1].select("send", "backward")[0].region == "input grad -> rank 0"
    recvs = [e for e in res.timeline if e.kind == "recv" and e.rank == 2]
    assert len(recvs) == 4 and all(e.peer == 1 for e in recvs)


def test_recompute_holds_only_stage_inputs_and_costs_a_forward_more():
    model, x, y = data(4, 8)
    full = pipeline_step(model, x, y, schedule="1f1b", stages=4, microbatches=8)
    rec = pipeline_step(model, x, y, schedule="1f1b", stages=4, microbatches=8, recompute=True)
    inp = 2 * 8 * 8
    assert rec.stash_bytes == [k * inp for k in rec.peak_stashed] == [4 * inp, 3 * inp, 2 * inp, inp]
    # per micro-batch, parameters excluded: x_k and the Linear's output (GELU's input); the last
    # stage also the GELU output and the target rows the loss saves (views count their own rows)
    assert full.stash_bytes == [k * n * inp for k, n in zip(full.peak_stashed, (2, 2, 2, 4))]
    assert rec.recompute_bytes == [b // k for b, k in zip(full.stash_bytes, full.peak_stashed)]
    assert pp_runtime.op_durations((1.0, 2.0), 1, True)["B"] == 3.0


def test_op_time_pads_every_op_to_its_fixed_duration():
    model, x, y = data(2, 2)
    res = pipeline_step(model, x, y, schedule="zb-h1", stages=2, microbatches=2,
                        op_time=(0.02, 0.01, 0.01))
    for e in res.timeline:
        if e.kind in "FIW":
            assert e.end - e.start >= (0.02 if e.kind == "F" else 0.01) * 0.99


def test_padded_ops_follow_each_other_and_each_message_leaves_after_its_op():
    """With fixed op times a rank is free when its previous op ended (the next op's start, unless
    it waited for a message), and a message leaves only once the op that made it has ended."""
    model, x, y = data(3, 4)
    res = pipeline_step(model, x, y, schedule="1f1b", stages=3, microbatches=4, op_time=(0.004, 0.008))
    for r in range(3):
        mine = [e for e in res.timeline if e.rank == r]
        ops = [e for e in mine if e.kind in "FB"]
        for before, after in zip(ops, ops[1:]):
            waited = [e.end for e in mine if e.kind == "recv" and before.end <= e.end <= after.start]
            assert after.start == max([before.end] + waited)
        for e in mine:
            if e.kind == "send":   # an activation comes from F, a grad from B, of its micro-batch
                kind = "F" if e.peer == r + 1 else "B"
                op = next(o for o in ops if o.kind == kind and o.microbatch == e.microbatch)
                assert op.end <= e.start
    assert 0 < res.hop_latency < 0.004 and len(res.hops()) > 0


def test_the_reference_is_built_once_per_problem_and_still_catches_a_bug(monkeypatch):
    from mtb_helpers.pp import check as pp_check
    pp_check._problem.cache_clear()
    calls = []
    real = pp_check.reference_step
    monkeypatch.setattr(pp_check, "reference_step", lambda *a, **k: calls.append(1) or real(*a, **k))
    for name in ("gpipe", "1f1b"):   # one problem, two schedules: one reference (run dtype + fp64)
        assert check_pipeline(name, stages=2, microbatches=4, dtype=F64, seed=5).passed
    assert len(calls) == 2
    assert not check_pipeline("1f1b", 2, 4, dtype=F64, seed=5, bug="pp-loss-not-scaled").passed
    check_pipeline("1f1b", stages=2, microbatches=4, dtype=F64, seed=6)   # another problem
    assert len(calls) == 4


def test_the_callers_model_is_untouched_by_a_step():
    model, x, y = data(2, 2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    pipeline_step(model, x, y, schedule="1f1b", stages=2, microbatches=2)
    assert all(p.grad is None and torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_with_fixed_op_times_every_receive_is_posted_before_the_step(monkeypatch):
    """``RankStage.receives`` names exactly the messages the ops then receive (a wrong tag would
    hang, a wrong shape raise); the blocking-send bug, which pre-posted receives hide, is refused."""
    from mtb_helpers.pp.p2p import ACTIVATION, GRAD, Message
    from mtb_helpers.pp.schedules import Op
    from mtb_helpers.pp.stage import RankStage
    stage = RankStage(1, 3, 4, {0: None}, [], [], None, None, [((2, 8), F64)] * 3)
    assert stage.receives(Op("F", 2, 0)) == [((2, 8), F64, Message(ACTIVATION, 0, 2, 0, 1))]
    assert stage.receives(Op("B", 3, 0)) == [((2, 8), F64, Message(GRAD, 2, 3, 2, 1))]
    last = RankStage(2, 3, 4, {0: None}, [], [], None, None, [((2, 8), F64)] * 3)
    assert last.receives(Op("B", 0, 0)) == [] and last.receives(Op("F", 0, 0))[0][2].src == 1
    for name in ("1f1b", "interleaved"):
        v = 2 if name == "interleaved" else 1
        model, x, y = data(3 * v, 6)
        res = pipeline_step(model, x, y, F.mse_loss, name, 3, 6, v, op_time=(0.002, 0.004))
        ref_loss, ref_grads = reference_step(model, x, y)
        assert abs(res.loss - float(ref_loss)) <= 1e-12
        assert all(torch.allclose(res.grads[n], g, rtol=0, atol=1e-12) for n, g in ref_grads.items())
    with pytest.raises(ValueError, match="op_time=None"):
        check_pipeline("1f1b", 2, 4, bug="pp-blocking-send", op_time=(0.01, 0.02))


def test_hops_are_measured_from_send_to_arrival_for_messages_a_receiver_waited_for():
    ev = pp_runtime.TimelineEvent
    timeline = [ev(0, "send", 0, 0, 1.0, 1.0, 1, 7), ev(1, "recv", 0, 0, 0.5, 1.25, 0, 7),   # waited
                ev(0, "send", 1, 0, 2.0, 2.0, 1, 8), ev(1, "recv", 1, 0, 3.0, 3.0, 0, 8),     # was there
                ev(1, "send", 0, 0, 4.0, 4.0, 0, 9), ev(0, "recv", 0, 0, 3.5, 4.75, 1, 9)]    # waited
    res = pp_runtime.PipelineResult(0.0, {}, timeline, [1, 1], [])
    assert res.hops() == [0.25, 0.75] and res.hop_latency == 0.5
    assert pp_runtime.PipelineResult(0.0, {}, timeline[2:4], [1, 1], []).hop_latency == 0.0


@pytest.mark.parametrize("kwargs,message", [
    (dict(blocks=3, stages=4), "has 6 layers"),
    (dict(m=3, microbatches=4), "batch of 6 rows"),
    (dict(schedule="interleaved", chunks=1), "chunks >= 2"),
    (dict(schedule="pipedream"), "unknown schedule"),
    (dict(op_time=(1.0,)), "op_time"),
    (dict(op_time=(0.0, 0.0)), "F and the backward > 0"),
    (dict(stages=0), "stages must be"),
    (dict(bug="f-backward-identity"), "does not apply"),
])
def test_bad_input_is_refused_before_any_rank_starts(no_ranks, kwargs, message):
    model, x, y = data(kwargs.pop("blocks", 2), kwargs.pop("m", 2))
    args = dict(schedule="1f1b", stages=2, microbatches=2) | kwargs
    with pytest.raises(ValueError, match=message):
        pipeline_step(model, x, y, **args)


def test_check_refuses_bad_input_before_any_rank_starts(no_ranks):
    with pytest.raises(ValueError, match="unknown bug"):
        check_pipeline(bug="no-such-bug")
    with pytest.raises(ValueError, match="does not apply"):
        check_pipeline(bug="f-backward-identity")
    with pytest.raises(ValueError, match="divisible by stages"):
        check_pipeline("interleaved", stages=4, microbatches=6)
    with pytest.raises(ValueError, match="only applies to the interleaved"):
        check_pipeline("1f1b", chunks=2)


def failed(rep):
    return sorted({(r.quantity, r.rank) for r in rep.failed()})


def grads_on(ranks, p=3):
    return sorted((f"{2 * s}.{w}.grad", s) for s in ranks for w in ("weight", "bias"))


@pytest.mark.parametrize("bug,broken", [
    ("pp-loss-not-scaled", [("loss", 2)] + grads_on([0, 1, 2])),   # m x: loss and every grad
    ("pp-input-grad-not-sent", grads_on([0, 1])),                  # all but the last stage
    ("pp-wrong-stash", grads_on([0, 1])),                          # stages holding > 1 stash
])
def test_each_bug_fails_exactly_the_quantities_it_breaks(bug, broken):
    rep = check_pipeline("1f1b", stages=3, microbatches=4, dtype=F64, bug=bug)
    assert failed(rep) == sorted(broken)


def test_blocking_send_deadlocks_1f1b_and_the_timeout_names_op_peer_and_line():
    with pytest.raises(RankTimeoutError) as info:
        check_pipeline("1f1b", stages=2, microbatches=3, dtype=F64, bug="pp-blocking-send",
                       timeout=3.0)
    text = str(info.value)
    assert "rank 0 was blocked in the send of the activation of micro-batch 1" in text
    assert "rank 0 -> rank 1" in text and "rank 1 -> rank 0" in text          # op and peer
    assert "called at mtb_helpers/pp/stage.py:" in text                       # the line
    # the runtime's own stack dump names the blocking line too (when a loaded machine lets the
    # ranks answer in time; "could not report" otherwise)
    assert "rank 0 waits in send at mtb_helpers/pp/bugs.py:" in text or "could not report" in text
    # GPipe sends every activation before any grad comes back: the same bug cannot hang it
    assert check_pipeline("gpipe", stages=2, microbatches=3, dtype=F64,
                          bug="pp-blocking-send").passed


def test_held_bytes_counts_views_by_their_own_bytes_shared_bytes_once_and_skips_parameters():
    from mtb_helpers.pp.stage import held_bytes
    batch = torch.zeros(16, 8, dtype=torch.float64)   # 1024 B
    rows = batch.chunk(8)[3]                           # [2, 8]: 128 B of it
    assert held_bytes([rows]) == 128
    assert held_bytes([rows, rows.t(), batch[6:8]]) == 128   # the same bytes three times
    assert held_bytes([batch[:4], batch[2:6]]) == 6 * 8 * 8  # overlapping rows 2-3 once
    weight = torch.nn.Linear(8, 8).weight
    assert held_bytes([rows, weight.t()], exclude={weight.untyped_storage().data_ptr()}) == 128


def test_a_stage_that_does_not_count_saved_bytes_computes_the_same_without_the_hook(monkeypatch):
    """``count_saved=False`` (the capstone's stages, which never show their bytes) installs no
    saved-tensor hook and counts 0 bytes; the loss and every grad are the counting stage's."""
    from mtb_helpers.pp.stage import RankStage
    model, x, y = data(2, 2)
    results = []
    for count in (True, False):
        if not count:   # the hook is the cost being saved: it must not be installed at all
            monkeypatch.setattr(torch.autograd.graph, "saved_tensors_hooks",
                                lambda *a: (_ for _ in ()).throw(AssertionError("hooked")))
        model.zero_grad(set_to_none=True)
        stage = RankStage(0, 1, 2, {0: model}, list(x.chunk(2)), list(y.chunk(2)), F.mse_loss, None,
                          [(x.chunk(2)[0].shape, F64)], count_saved=count)
        for k in range(2):
            stage.forward(k, 0)
        peak = stage.peak_bytes
        for k in range(2):
            stage.backward(k, 0)
        results.append((peak, dict(stage.losses), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (peak, losses, grads), (no_peak, no_losses, no_grads) = results
    assert peak > 0 and no_peak == 0 and losses == no_losses
    assert all(torch.equal(grads[n], no_grads[n]) for n in grads)
