"""Issue 25, items 5, 6 and 8 (pipeline): impossible op times and bad models are refused before
any rank starts, and a hang report names only the point-to-point ops still pending."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from mtb_helpers import RankTimeoutError
from mtb_helpers.cli import main
from mtb_helpers.pp import pipeline_step


def _model(layers: int = 4) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(4, 4) for _ in range(layers)])


X, Y = torch.randn(8, 4), torch.randn(8, 4)


@pytest.mark.parametrize("op_time, message", [
    ((math.inf, 1), r"op_time"),
    ((1, math.nan), r"op_time"),
    ("ab", r"op_time"),
    ((0.1, "x"), r"op_time"),
    ((1e9, 1e9), r"op_time=\(1000000000\.0, 1000000000\.0\).* timeout=60"),
    ((1.0, 2.0), r"timeout=5 s: .* simulated makespan"),
])
def test_impossible_op_times_are_refused_before_any_rank_starts(no_ranks, op_time, message):
    timeout = 5.0 if op_time == (1.0, 2.0) else 60.0      # 1F1B, 4 stages, 8 micro-batches: 33 s
    with pytest.raises(ValueError, match=message):
        pipeline_step(_model(), X, Y, stages=4, microbatches=8, op_time=op_time, timeout=timeout)


def test_an_empty_model_is_refused_naming_it(no_ranks):
    with pytest.raises(ValueError, match=r"model .* no layers"):
        pipeline_step(nn.Sequential(), X, Y, stages=2, microbatches=2)


@pytest.mark.parametrize("kwargs, message", [
    (dict(timeout=math.nan), r"timeout"), (dict(timeout=-1.0), r"timeout"),
    (dict(x=[[1.0] * 4] * 8), r"x must be a tensor"), (dict(target=3.0), r"target must be a tensor"),
])
def test_bad_timeout_and_inputs_are_refused_naming_them(no_ranks, kwargs, message):
    args = {"x": X, "target": Y, **kwargs}
    with pytest.raises(ValueError, match=message):
        pipeline_step(_model(), args.pop("x"), args.pop("target"), stages=2, microbatches=2, **args)


@pytest.mark.parametrize("op_time", ["inf,1", "1,nan", "1e9,1e9"])
def test_pp_run_refuses_impossible_op_times_with_exit_2_and_one_line(no_ranks, capsys, op_time):
    assert main(["pp", "run", "--op-time", op_time]) == 2
    err = capsys.readouterr().err
    assert "op-time" in err or "op_time" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_hang_report_names_only_what_is_still_pending():
    class Stall(nn.Module):
        """Stage 1's forward never ends (as if it were stuck in a long computation); the first
        call is the shape probe every rank runs before the step."""
        calls = 0

        def forward(self, x):
            import time

            import torch.distributed as dist
            self.calls += 1
            if dist.get_rank() == 1 and self.calls > 1:
                time.sleep(60)
            return x * 1.0

    model = nn.Sequential(nn.Linear(4, 4), Stall())
    with pytest.raises(RankTimeoutError) as info:
        pipeline_step(model, X, Y, stages=2, microbatches=2, timeout=3)
    text = str(info.value)
    p2p = text.split("Point-to-point ops the ranks were blocked in:")[-1]
    assert "rank 1 was blocked" not in p2p, text          # its recv had completed long before
    assert "rank 0 was blocked in the recv of the input grad" in p2p, text
