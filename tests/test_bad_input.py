"""Issue 38: bad input to ``cost predict``, ``cost calibrate``, ``plan``, ``dp overlap`` and to
``run(..., link=Link(...))``, tried as a new user would. Each of the issue's 13 reproducers is a
test here (numbered as in the issue): a clear refusal before any rank starts (exit 2, one line
naming the option and the value typed, one JSON document under ``--json``), or the right result;
and the next call works. The torchrun cases (3) are in test_torchrun_cli.py."""
from __future__ import annotations

import gc
import json
import time
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist

from mtb_helpers import RankTimeoutError, run
from mtb_helpers.cli import main
from mtb_helpers.cost import (Link, algbw, busbw, coefficients, n_half, predict,
                              predict_pipeline_step_time)
from mtb_helpers.cost.calibrate import _elements, _time_on_ranks
from mtb_helpers.plan.search import divisors

PREDICT = ["cost", "predict", "--collective", "all-reduce", "--bytes", "1e8", "--world-size", "8",
           "--alpha", "5e-6", "--bandwidth", "50e9"]
PLAN = ["plan", "--model", "llama3-8b", "--gpus", "64", "--global-batch", "1024"]


def command(argv: list[str], capsys) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of ``minitrainbench argv`` (argparse's refusals raise
    SystemExit(2), as the console script does)."""
    try:
        status = main(argv)
    except SystemExit as stop:
        status = stop.code
    out, err = capsys.readouterr()
    return status, out, err


def refused(argv: list[str], capsys, *named: str) -> None:
    """``argv`` exits 2 with one error line naming each of ``named`` (the option and the text the
    user typed), no traceback; with ``--json`` stdout is one document saying the same; and the
    next command works."""
    status, out, err = command(argv, capsys)
    assert status == 2, (argv, out, err)
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in err, err
    for text in named:
        assert text in errors[0], (text, errors[0])
    assert "seconds" not in errors[0] and "OverflowError" not in err
    status, out, err = command(argv + ["--json"], capsys)
    assert status == 2
    doc = json.loads(out)                      # the whole of stdout: exactly one document
    assert doc["passed"] is False and doc["error"]["diagnosis"].startswith("bad arguments")
    for text in named:
        assert text in doc["error"]["message"], (text, doc)
    assert command(PREDICT, capsys)[0] == 0     # the next call works


# 1. --sizes inf: OverflowError traceback, stdout empty
@pytest.mark.parametrize("sizes, typed", [("inf,1024", "inf"), ("1024,nan", "nan"),
                                          ("1e400,1024", "1e400"), ("abc", "abc")])
def test_1_calibrate_refuses_sizes_that_are_not_byte_counts(no_ranks, capsys, sizes, typed):
    refused(["cost", "calibrate", "--sizes", sizes], capsys, "--sizes", typed)


# 2. --gpus 8000000000: divisors looped up to the GPU count
def test_2_divisors_come_from_prime_factors_and_match_the_definition(no_ranks):
    for n in range(1, 400):
        assert divisors(n) == [k for k in range(1, n + 1) if n % k == 0]
    t0 = time.perf_counter()
    big = divisors(8_000_000_000)                 # 2^12 x 5^9: 13 x 10 divisors
    prime = divisors(2**31 - 1)                   # a Mersenne prime: only 1 and itself
    largest = divisors(2**40 - 87)                # the largest prime below MAX_GPUS: 2**19 divisions
    assert time.perf_counter() - t0 < 0.5
    assert len(big) == 130 and big == sorted(big) and all(8_000_000_000 % d == 0 for d in big)
    assert prime == [1, 2**31 - 1] and largest == [1, 2**40 - 87]


def test_2_plan_answers_a_huge_gpu_count_quickly(no_ranks, capsys):
    gpus = 8 * (2**31 - 1)                      # a loop up to it: hours; its factors: at once
    argv = ["plan", "--model", "llama3-8b", "--gpus", str(gpus), "--global-batch", "1024", "--json"]
    t0 = time.perf_counter()
    status, out, err = command(argv, capsys)
    took = time.perf_counter() - t0
    assert status in (0, 1), err                # an answer: some layout fits, or none does
    doc = json.loads(out)
    assert doc["gpus"] == gpus and doc["fit"] + doc["refused"] > 0
    assert took < 3.0, took                     # well under a second on an idle machine


@pytest.mark.parametrize("gpus, why", [(8_000_000_000, "2^12 x 5^9 split into 100100"),
                                       (963761198400, "split into 120422400"),
                                       (2**70, "below 2**40")])
def test_2_a_gpu_count_with_too_many_layouts_is_refused_at_once(no_ranks, capsys, gpus, why):
    t0 = time.perf_counter()
    refused(PLAN[:3] + ["--gpus", str(gpus)] + PLAN[5:], capsys, f"--gpus {gpus}", why)
    assert time.perf_counter() - t0 < 3.0       # two commands and the next call


# 4. --alpha 1e300, Link(1e-3, 1e-300): OverflowError "timestamp out of range" from a rank
@pytest.mark.parametrize("alpha, bandwidth, what", [(1e-3, 1e-300, "one byte"),
                                                     (1e300, 1e9, "one message"),
                                                     (4e7, 1e9, "one message"),
                                                     (1e-3, 1e-8, "one byte")])
def test_4_a_link_that_overflows_time_is_refused_at_construction(no_ranks, alpha, bandwidth, what):
    with pytest.raises(ValueError, match=rf"this link would take [0-9.e+]+ years to send {what}"):
        Link(alpha, bandwidth)
    assert Link(1.0, 1.0).alpha == 1.0           # slow but not absurd: accepted


def test_4_dp_overlap_refuses_an_absurd_link_before_any_rank_starts(no_ranks, capsys):
    refused(["dp", "overlap", "--alpha", "1e300"], capsys, "--alpha 1e300", "years")
    refused(["dp", "overlap", "--bandwidth", "1e-300"], capsys, "--bandwidth 1e-300", "years")
    refused(["dp", "overlap", "--time-scale", "1e300"], capsys, "--time-scale 1e300", "years")


def test_4_run_refuses_a_time_scale_that_overflows_time(no_ranks):
    with pytest.raises(ValueError, match=r"time_scale=1e\+300 .* years"):
        run(lambda: 0, world_size=2, link=Link(1e-3, 1e9), time_scale=1e300)


# 5. --world-size 1: text exited 2 after the ranks ran; --json exit 0 with a made-up fit
def test_5_calibrate_refuses_one_rank_before_any_rank_starts(no_ranks, capsys):
    refused(["cost", "calibrate", "--world-size", "1"], capsys, "--world-size 1")


# 6. --sizes 4,5,6,7: every row 8 bytes, a fit reported from one size
def test_6_calibrate_refuses_sizes_that_round_to_one_measurement(no_ranks, capsys):
    refused(["cost", "calibrate", "--collective", "all-reduce", "--sizes", "4,5,6,7", "--k", "3"],
            capsys, "--sizes 4,5,6,7", "8 bytes")
    refused(["cost", "calibrate", "--sizes", "2,1024"], capsys, "--sizes 2,1024", "one float32")


def test_6_every_size_kept_is_measured_as_asked_after_rounding():
    """The sizes the fit gets are the bytes the ranks really moved (whole float32 elements)."""
    for collective in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all"):
        for p in (2, 3, 4):
            n = _elements(collective, 1000, p)
            moved = 4 * (n * p if collective == "all-gather" else n)
            assert 1000 - 4 * p < moved <= 1000, (collective, p, moved)


# 7. --steps 0, --time-scale 0: the ranks ran, then a StatisticsError called "refused before"
@pytest.mark.parametrize("option, value", [("--steps", "0"), ("--time-scale", "0"),
                                           ("--layers", "-1"), ("--hidden", "0"),
                                           ("--bucket-cap-mb", "-1"), ("--time-scale", "nan"),
                                           ("--world-size", "0")])
def test_7_dp_overlap_refuses_bad_sizes_before_any_rank_starts(no_ranks, capsys, option, value):
    refused(["dp", "overlap", option, value], capsys, f"{option}", value)


# 8. --reserve inf / --reserve 100 on 80 GiB: every layout "needs 285.7 GiB > -inf GiB"
@pytest.mark.parametrize("extra, named", [
    (["--reserve", "inf"], ("--reserve", "inf")), (["--reserve", "-1"], ("--reserve", "-1")),
    (["--reserve", "100"], ("--reserve 100", "80 GiB")),
    (["--reserve", "80"], ("--reserve 80", "80 GiB")),
    (["--reserve", "8", "--gpu-memory", "8"], ("--reserve 8", "--gpu-memory 8")),
    (["--gpu-memory", "inf"], ("--gpu-memory", "inf")), (["--mfu", "1.5"], ("--mfu", "1.5")),
    (["--global-batch", "0"], ("--global-batch", "0")), (["--top", "0"], ("--top", "0"))])
def test_8_plan_refuses_a_reserve_that_leaves_no_memory(no_ranks, capsys, extra, named):
    refused(PLAN + extra, capsys, *named)


# 9. --bytes 1e308 --bandwidth 1e-300: "seconds must be finite", an option never passed
@pytest.mark.parametrize("options, named", [
    (["--bytes", "1e308", "--bandwidth", "1e-300"], ("--bandwidth 1e-300", "years")),
    (["--bytes", "1e308", "--bandwidth", "1", "--algorithm", "naive"], ("--bytes 1e308", "years")),
    (["--bytes", "inf"], ("--bytes", "inf")), (["--world-size", "0"], ("--world-size", "0")),
    (["--alpha", "-0.5"], ("--alpha", "-0.5"))])
def test_9_cost_predict_names_the_options_the_user_passed(no_ranks, capsys, options, named):
    argv = list(PREDICT)
    for key, value in zip(options[::2], options[1::2]):
        if key in argv:
            argv[argv.index(key) + 1] = value
        else:
            argv += [key, value]
    refused(argv, capsys, *named)


def test_9_a_huge_but_finite_prediction_is_the_right_result(no_ranks, capsys):
    argv = PREDICT[:5] + ["1e300"] + PREDICT[6:-2] + ["--bandwidth", "1", "--json"]
    status, out, _ = command(argv, capsys)
    assert status == 0 and json.loads(out)["seconds"] == pytest.approx(14 * 5e-6 + 1.75e300)


# 10. numpy scalars: "must be a number"
def test_10_numpy_scalars_are_numbers_and_bools_are_not(no_ranks):
    link = Link(np.float32(1e-6), np.int64(10**9))
    assert link == Link(float(np.float32(1e-6)), 1e9) and type(link.alpha) is float
    assert Link(np.float64(1e-6), np.float32(1e9)).bandwidth == pytest.approx(1e9)
    plain = predict("all-reduce", 2**20, 4, Link(1e-6, 1e9))
    assert predict("all-reduce", np.int64(2**20), np.int64(4), link) == pytest.approx(plain)
    assert coefficients("all-reduce", np.int32(4)) == coefficients("all-reduce", 4)
    assert n_half("all-reduce", np.int64(4), link) == pytest.approx(n_half("all-reduce", 4, link))
    assert algbw(np.float32(1e6), np.float64(1e-3)) == pytest.approx(1e9)
    assert busbw("all-reduce", np.int64(10**6), np.float32(1e-3), np.int64(2)) == pytest.approx(1e9)
    step = predict_pipeline_step_time("1f1b", 4, 8, (1e-3, 2e-3), 10**6, link)
    assert predict_pipeline_step_time("1f1b", np.int64(4), np.int64(8), (np.float32(1e-3), 2e-3),
                                      np.int64(10**6), link) == pytest.approx(step, rel=1e-6)
    for bad in (lambda: Link(True, 1e9), lambda: Link(1e-6, np.bool_(True)),
                lambda: predict("all-reduce", 10, True, link),
                lambda: predict("all-reduce", np.bool_(False), 4, link),
                lambda: predict("all-reduce", 10, np.float64(4.0), link),
                lambda: predict_pipeline_step_time("1f1b", True, 8, (1e-3, 2e-3), 10, link)):
        with pytest.raises(ValueError):
            bad()


# 11. a module already wrapped by PyTorch's DDP, passed to OverlappedDDP or FSDP: accepted
def _wrap_twice() -> list[str]:
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from mtb_helpers.dp import FSDP, OverlappedDDP
    out = []
    for wrapper in (OverlappedDDP, FSDP):
        inner = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
        ddp = DistributedDataParallel(inner)
        for given in (ddp, inner, nn.Sequential(inner)):   # itself, what it wraps, a parent
            try:
                wrapper(given)
                out.append("accepted")
            except ValueError as exc:
                out.append(str(exc))
        del ddp
        gc.collect()
        out.append(type(wrapper(inner)).__name__)          # once PyTorch's DDP is gone: fine
    return out


def test_11_a_module_wrapped_by_pytorchs_ddp_is_refused():
    messages = run(_wrap_twice, world_size=2)[0]
    for wrapper, results in (("OverlappedDDP", messages[:4]), ("FSDP", messages[4:])):
        for message in results[:3]:
            assert message.startswith(f"{wrapper}: ") and "DistributedDataParallel" in message, \
                message
        assert results[3] == wrapper


# 12. a link so slow that a call times out: reported as a mismatch ("a rank that skipped it")
def _big_all_reduce() -> int:
    dist.all_reduce(torch.ones(2**16))           # 256 KiB at 1 kB/s: ~4 minutes modelled
    return 0


def test_12_a_call_the_link_makes_slower_than_the_timeout_names_the_link():
    t0 = time.perf_counter()
    with pytest.raises(RankTimeoutError) as info:
        run(_big_all_reduce, world_size=2, link=Link(25e-3, 1e3), timeout=20)
    message = str(info.value)
    assert time.perf_counter() - t0 < 15          # refused when issued, not after the timeout
    assert "skipped it" not in message
    assert "emulated link" in message and "α = 25 ms, β = 1 kB/s" in message
    assert "all-reduce of 262144 B" in message and "262 s" in message and "timeout=20" in message
    assert run(lambda: 1, world_size=2, link=Link(25e-3, 1e7)) == [1, 1]   # the next call works


# 13. cost calibrate: every rank printed torch 2.13's FutureWarnings
def _warned(plan: list) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _time_on_ranks(plan, 0, 1)
    return [f"{w.category.__name__}: {w.message}" for w in caught
            if issubclass(w.category, (FutureWarning, DeprecationWarning))]


def test_13_calibration_makes_no_deprecated_call():
    plan = [(c, _elements(c, 4096, 2)) for c in
            ("broadcast", "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send/recv")]
    assert run(_warned, plan, world_size=2) == [[], []]
