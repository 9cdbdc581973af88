"""check_capstone: every layout the issue lists trains step for step like one process, bytes per
group equal the formulas, each deliberate bug fails exactly what it breaks, bad input is refused
before any rank starts."""
from __future__ import annotations

import json

import pytest
import torch

import mtb_helpers.capstone.parallel as parallel_module
from mtb_helpers import BUGS
from mtb_helpers.capstone.bugs import CAPSTONE_BUGS
from mtb_helpers.capstone.check import LAYOUTS, check_capstone
from mtb_helpers.capstone.bugs import BUGS as REGISTRY


def _assert_bytes_match(report):
    b = report.extra["bytes"]
    assert b["per_rank"] == b["formula"], (b["per_rank"], b["formula"])


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_every_issue_layout_matches_one_process_in_fp64(layout):
    report = check_capstone(layout.tp, layout.pp, layout.dp, layout.cp, steps=2)
    assert report.passed, str(report)
    assert [(r.quantity, r.note) for r in report.rows[:2]] == [("loss", "step 1"), ("loss", "step 2")]
    assert {r.rank for r in report.rows if r.quantity == "params"} == set(range(layout.world_size))
    assert max(r.max_abs_err for r in report.rows) < 1e-12 and report.rows[0].tolerance == 1e-10
    _assert_bytes_match(report)
    sent = report.extra["bytes"]["per_rank"]
    sizes = (("tp", layout.tp), ("pp", layout.pp), ("dp", layout.dp * layout.cp), ("cp", layout.cp))
    for group, size in sizes:   # gradients are averaged over dp x cp
        assert (max(s[group] for s in sent) > 0) == (size > 1), group   # a group of 1 sends nothing


@pytest.mark.parametrize("kwargs", [dict(tp=2, pp=2, sequence_parallel=False),
                                    dict(pp=2, dp=2, strategy="zero1"),
                                    dict(tp=2, dp=2, cp=2, schedule="gpipe", microbatches=1)],
                         ids=["tp-without-sp", "zero1", "tp-dp-cp-gpipe"])
def test_variants_match_one_process(kwargs):
    report = check_capstone(steps=2, **kwargs)
    assert report.passed, str(report)
    _assert_bytes_match(report)


def test_float32_within_its_stated_tolerance():
    report = check_capstone(2, 1, 1, 2, steps=3, dtype=torch.float32)
    assert report.passed, str(report)
    assert {r.tolerance for r in report.rows} == {1e-5, 1e-3}


def test_bugs_are_registered_in_the_one_shape():
    assert set(CAPSTONE_BUGS) <= set(BUGS)
    for name in CAPSTONE_BUGS:
        for correct, wrong in REGISTRY[name].replaces.items():
            assert issubclass(wrong, correct) and wrong is not correct


@pytest.mark.parametrize("bug, layout, first_bad_step", [
    ("capstone-dp-allreduce-in-tp-group", (2, 1, 2, 1), 2),
    ("capstone-dp-allreduce-in-tp-group", (1, 1, 2, 1), 2),
    ("capstone-grads-not-averaged-over-cp", (1, 1, 2, 2), 2),
    ("capstone-cp-local-positions", (1, 2, 1, 2), 1),
    ("capstone-sp-grads-not-reduced", (2, 2, 1, 1), 2),
    ("capstone-sp-grads-not-reduced", (2, 1, 2, 1), 2),
])
def test_each_bug_fails_exactly_what_it_breaks(bug, layout, first_bad_step):
    report = check_capstone(*layout, steps=3, bug=bug)
    world = layout[0] * layout[1] * layout[2] * layout[3]
    failed = {(r.quantity, r.note if r.quantity != "params" else r.rank) for r in report.failed()}
    # the step (re-anchored on the run's own state) is wrong from the first update; the loss
    # once replicas (or chunks) disagree, wrong positions at once
    expected = {("loss", f"step {k}") for k in range(first_bad_step, 4)}
    expected |= {("step", f"step {k}") for k in range(1, 4)}
    expected |= {("params", r) for r in range(world)}
    assert failed == expected, str(report)
    assert report.config["bug"] == bug


@pytest.mark.parametrize("bug", ["capstone-grads-not-averaged-over-cp", "capstone-cp-local-positions"])
def test_context_bugs_have_nothing_to_break_without_context_parallelism(bug):
    assert check_capstone(1, 1, 2, 1, steps=2, bug=bug).passed


def test_the_sp_grad_bug_has_nothing_to_break_without_sequence_parallelism():
    assert check_capstone(2, 2, 1, 1, steps=2, sequence_parallel=False,
                          bug="capstone-sp-grads-not-reduced").passed


def test_report_is_strict_json_with_curves_grid_and_bytes():
    report = check_capstone(2, 2, 1, 1, steps=2)
    data = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert len(data["losses"]["parallel"]) == len(data["losses"]["reference"]) == 2
    assert data["grid"][3] == {"rank": 3, "tp": 1, "cp": 0, "dp": 0, "pp": 1, "blocks": [2, 4],
                               "embedding": False, "head": True, "heads": [2, 4],
                               "positions": [0, 16], "sequences": [0, 8]}
    assert max(data["param_errors"].values()) < 1e-12 and len(data["param_errors"]) == 68


@pytest.mark.parametrize("kwargs, message", [
    (dict(tp=3), r"heads=4 is not divisible by tp=3"),
    (dict(pp=3), r"layers=4 is not divisible by pp=3"),
    (dict(cp=3), r"seq=16 is not divisible by cp=3"),
    (dict(tp=2, cp=2, dp=2, pp=2), r"16 ranks; this machine runs at most 8"),
    (dict(dp=4, microbatches=4), r"batch=8 is not divisible by dp\*microbatches = 4\*4"),
    (dict(tp=0), r"tp must be a positive integer"),
    (dict(schedule="interleaved"), r"schedule must be one of 1f1b, gpipe"),
    (dict(strategy="zero3"), r"strategy must be one of ddp, zero1"),
    (dict(dtype=torch.float16), r"dtype"),
    (dict(bug="no-such-bug"), r"unknown bug"),
    (dict(bug="dp-sum-not-average"), r"does not apply"),
])
def test_bad_input_is_refused_before_any_rank_starts(monkeypatch, kwargs, message):
    def no_ranks(*args, **kw):
        raise AssertionError("a rank was started")

    monkeypatch.setattr(parallel_module, "run", no_ranks)
    with pytest.raises(ValueError, match=message):
        check_capstone(**kwargs)


def test_the_reused_anchored_reference_carries_nothing_from_one_check_to_the_next(references_built):
    """The re-anchored reference is kept between checks (it loads the whole state before every
    step): a correct check right after a failing one gives the rows of a freshly made reference."""
    from mtb_helpers.capstone import check as check_module
    assert not check_capstone(tp=2, steps=2, bug="capstone-dp-allreduce-in-tp-group").passed
    before = len(references_built)
    after_bug = check_capstone(tp=2, steps=2)
    assert len(references_built) == before           # the failing check's reference, reused
    check_module._REFERENCES.clear()
    fresh = check_capstone(tp=2, steps=2)
    assert after_bug.passed and len(references_built) == before + 1
    assert [(r.quantity, r.max_abs_err) for r in after_bug.rows] == \
        [(r.quantity, r.max_abs_err) for r in fresh.rows]


@pytest.mark.parametrize("sizes", [dict(tp=2, pp=2), dict(tp=2, dp=2, strategy="zero1")])
def test_full_state_pieces_the_shards_together_as_gather_param_does(sizes):
    """``full_state`` gathers every snapshot with one index for the whole model; each tensor must
    be what ``gather_param`` makes of the tensor-parallel shards (moments pieced from the ZeRO-1
    slices of every replica)."""
    import math

    from mtb_helpers.capstone.grid import GridLayout
    from mtb_helpers.capstone.layers import gather_param
    from mtb_helpers.capstone.model import make_model
    from mtb_helpers.capstone.parallel import train_parallel
    from mtb_helpers.capstone.state import full_state
    calls = []
    train_parallel(**sizes, steps=2, on_call=lambda first, res: calls.append(
        [dict(r, snapshots=list(r["snapshots"])) for r in res]))
    results, layout = calls[0], GridLayout(sizes["tp"], sizes.get("pp", 1), sizes.get("dp", 1))
    names, full_shapes = zip(*((n, p.shape) for n, p in make_model().named_parameters()))
    for i in range(3):
        flats = full_state(results, layout, i, names)   # [Ψ] each, in the model's order
        state = {kind: dict(zip(names, (v.view(s) for v, s in zip(
                     flats[kind].split([math.prod(s) for s in full_shapes]), full_shapes))))
                 for kind in ("params", "exp_avg", "exp_avg_sq")}
        for stage in range(layout.pp):
            cells = [[r for r in results if (r["index"]["pp"], r["index"]["tp"]) == (stage, j)]
                     for j in range(layout.tp)]
            shapes = {n: p.shape for n, p in cells[0][0]["params"].items()}
            for kind in ("params", "exp_avg", "exp_avg_sq"):
                shards = []
                for owners in cells:
                    vec = torch.zeros(sum(math.prod(s) for s in shapes.values()), dtype=torch.float64)
                    for o in (owners if kind != "params" else owners[:1]):
                        lo, hi = o["snapshots"][i]["own"] if kind != "params" else (0, len(vec))
                        vec[lo:hi] = o["snapshots"][i][kind][:len(vec) - lo]
                    parts = vec.split([math.prod(s) for s in shapes.values()])
                    shards.append({n: p.view(s) for (n, s), p in zip(shapes.items(), parts)})
                for name in shapes:
                    for full, want in gather_param([s[name] for s in shards], name).items():
                        assert torch.equal(state[kind][full], want), (i, kind, full)
    assert all(len(flats[kind]) == sum(math.prod(s) for s in full_shapes) for kind in state)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_first_step_from_the_model_as_made_is_the_free_runs_first_step(dtype):
    """What lets a check take the re-anchored reference's first step from the free run: from the
    same start, a fresh re-anchored step is the free run's first step, bit for bit."""
    from mtb_helpers.capstone.check import free_run, starts_like
    from mtb_helpers.capstone.model import GPTConfig
    from mtb_helpers.capstone.reference import Reference, TrainConfig
    free = free_run(GPTConfig(), TrainConfig(steps=2), dtype)
    start = {"params": free.start.clone(), "exp_avg": torch.zeros_like(free.start),
             "exp_avg_sq": torch.zeros_like(free.start), "step": 0}
    assert starts_like(start, free)
    loss, after = Reference(GPTConfig(), TrainConfig(steps=1), dtype).step(0, start)
    assert loss == free.losses[0] and torch.equal(after, free.flats[0])


def test_a_start_one_bit_away_from_the_models_is_stepped_again():
    """The deliberate mistakes: one bit of one parameter, a moment of -0.0, a step already taken;
    each is another start, and the check must step the re-anchored reference from it."""
    from mtb_helpers.capstone.check import free_run, starts_like
    from mtb_helpers.capstone.model import GPTConfig
    from mtb_helpers.capstone.reference import TrainConfig
    free = free_run(GPTConfig(), TrainConfig(steps=2), torch.float64)
    zeros = torch.zeros_like(free.start)
    params = free.start.clone()
    params.view(torch.int64)[7] ^= 1                        # the last bit of one parameter
    minus_zero = zeros.clone()
    minus_zero[3] = -0.0
    for state in ({"params": params, "exp_avg": zeros, "exp_avg_sq": zeros, "step": 0},
                  {"params": free.start, "exp_avg": minus_zero, "exp_avg_sq": zeros, "step": 0},
                  {"params": free.start, "exp_avg": zeros, "exp_avg_sq": zeros, "step": 1},
                  {"params": free.start.float(), "exp_avg": zeros.float(),
                   "exp_avg_sq": zeros.float(), "step": 0}):
        assert not starts_like(state, free)


def test_a_check_that_takes_the_free_runs_first_step_gives_the_rows_of_one_that_steps(monkeypatch):
    from mtb_helpers.capstone import check as check_module
    answers, starts_like = [], check_module.starts_like
    monkeypatch.setattr(check_module, "starts_like",
                        lambda state, free: answers.append(starts_like(state, free)) or answers[-1])
    taken = check_capstone(tp=2, pp=2, steps=2)
    assert answers == [True]                     # asked at the first step only, and it was taken
    monkeypatch.setattr(check_module, "starts_like", lambda state, free: False)
    stepped = check_capstone(tp=2, pp=2, steps=2)
    assert taken.passed and stepped.passed
    assert [(r.quantity, r.rank, r.note, r.max_abs_err) for r in taken.rows] == \
        [(r.quantity, r.rank, r.note, r.max_abs_err) for r in stepped.rows]
