"""Our pipeline against PyTorch's own (torch.distributed.pipelining) on the same ranks, model and
data: PipelineStage with ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B and
ScheduleInterleavedZeroBubble (which runs on gloo) give the same grads to fp64 rounding."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from mtb_helpers import run
from mtb_helpers.pp import pipeline_step
from mtb_helpers.pp.check import make_pipeline_model
from mtb_helpers.pp.runtime import split_model


def torch_pipeline(model, x, target, schedule_class, m, v):
    """On every rank: PyTorch's stages for pieces r, r+p, ... and one schedule step."""
    from torch.distributed import pipelining

    r, p = dist.get_rank(), dist.get_world_size()
    pieces = split_model(model, p * v)
    stages = [pipelining.PipelineStage(pieces[c * p + r], c * p + r, p * v, torch.device("cpu"))
              for c in range(v)]
    sched = getattr(pipelining, schedule_class)(stages if v > 1 else stages[0], m,
                                                loss_fn=F.mse_loss)
    losses: list = []
    kwargs = {"target": target, "losses": losses} if r == p - 1 else {}
    sched.step(*((x,) if r == 0 else ()), **kwargs)
    grads = {n: prm.grad for c in range(v) for n, prm in pieces[c * p + r].named_parameters()}
    return grads, [float(loss.detach()) for loss in losses]


@pytest.mark.parametrize("ours,theirs,p,m,v", [
    ("gpipe", "ScheduleGPipe", 2, 4, 1),
    ("1f1b", "Schedule1F1B", 4, 8, 1),
    ("interleaved", "ScheduleInterleaved1F1B", 2, 4, 2),
    ("zb-h1", "ScheduleInterleavedZeroBubble", 2, 4, 2),   # theirs needs >= 2 stages per rank
])
def test_same_grads_as_torch_distributed_pipelining(ours, theirs, p, m, v):
    v_ours = v if ours == "interleaved" else 1
    model = make_pipeline_model(p * v, 8, torch.float64, seed=3)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2 * m, 8, dtype=torch.float64, generator=g)
    y = torch.randn(2 * m, 8, dtype=torch.float64, generator=g)
    results = run(torch_pipeline, model, x, y, theirs, m, v, world_size=p, timeout=60)
    torch_grads = {}
    for grads, _ in results:
        torch_grads.update(grads)
    mine = pipeline_step(model, x, y, F.mse_loss, ours, p, m, v_ours)
    assert set(torch_grads) == set(mine.grads)
    for name, grad in mine.grads.items():
        assert torch.allclose(grad, torch_grads[name], rtol=0, atol=1e-12), name
    # their losses are per micro-batch and unscaled; ours is the batch mean
    assert abs(sum(results[-1][1]) / m - mine.loss) <= 1e-12
