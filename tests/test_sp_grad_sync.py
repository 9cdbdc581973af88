"""The sequence-parallel layers' ``grad_sync``: ``"backward"`` (notebook 04) sums the replicated
grads inside backward, ``"step"`` (the capstone) leaves them partial, this rank's rows only."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from mtb_helpers import run
from mtb_helpers.comm.records import record
from mtb_helpers.comm.regions import GRAD_ALLREDUCE_SP
from mtb_helpers.sp.layers import (SequenceParallelLayerNorm, SequenceParallelMLPBlock,
                                   SequenceParallelRowLinear)
from mtb_helpers.sp.memory import make_block_inputs

REPLICATED = ("ln.weight", "ln.bias", "fc2.bias")


@pytest.mark.parametrize("build", [
    lambda: SequenceParallelLayerNorm.from_full(nn.LayerNorm(4), grad_sync="never"),
    lambda: SequenceParallelLayerNorm(torch.ones(4), torch.zeros(4), grad_sync="Step"),
    lambda: SequenceParallelRowLinear.from_full(nn.Linear(4, 4), grad_sync="finalize"),
    lambda: SequenceParallelRowLinear(torch.ones(4, 4), None, 4, 4, grad_sync=None),
    lambda: SequenceParallelMLPBlock.from_full(nn.LayerNorm(4), nn.Linear(4, 6), nn.Linear(6, 4),
                                               grad_sync="after"),
])
def test_an_unknown_grad_sync_is_refused_naming_the_allowed_ones(no_ranks, build):
    with pytest.raises(ValueError, match=r"grad_sync must be one of 'backward', 'step'"):
        build()


def test_the_default_is_notebook_04s_sum_in_backward(no_ranks):
    block = SequenceParallelMLPBlock.from_full(nn.LayerNorm(4), nn.Linear(4, 6), nn.Linear(6, 4))
    assert block.ln.grad_sync == block.fc2.grad_sync == "backward"
    step = SequenceParallelMLPBlock.from_full(nn.LayerNorm(4), nn.Linear(4, 6), nn.Linear(6, 4),
                                              grad_sync="step")
    assert step.ln.grad_sync == step.fc2.grad_sync == "step"
    assert "grad_sync='step'" in repr(step)


def _block_on_rank(ln, fc1, fc2, x, dy, grad_sync):
    import torch.distributed as dist

    from mtb_helpers.comm.sharding import shard_range
    lo, hi = shard_range(x.shape[0], dist.get_world_size(), dist.get_rank())
    block = SequenceParallelMLPBlock.from_full(ln, fc1, fc2, dropout_p=0.0, grad_sync=grad_sync)
    xr = x[lo:hi].clone().requires_grad_(True)
    with record() as rec:
        y = block(xr)
        y.backward(dy[lo:hi])
    grads = {n: p.grad for n, p in block.named_parameters()}
    return y.detach(), xr.grad, grads, sorted(e.operator for e in rec.events
                                              if e.region == GRAD_ALLREDUCE_SP)


def test_step_leaves_exactly_the_replicated_grads_partial_over_the_ranks():
    inputs = make_block_inputs(8, 2, 4, 6, torch.float64, seed=3)
    summed = run(_block_on_rank, *inputs, "backward", world_size=2)
    partial = run(_block_on_rank, *inputs, "step", world_size=2)
    for (y, dx, grads, ops), (y_s, dx_s, grads_s, ops_s) in zip(summed, partial):
        assert ops == ["fc2.bias", "ln.bias", "ln.weight"] and ops_s == []
        assert torch.equal(y, y_s) and torch.equal(dx, dx_s)    # forward and dX: the same math
        for name in ("fc1.weight", "fc1.bias", "fc2.weight"):   # sharded: already exact per rank
            assert torch.equal(grads[name], grads_s[name])
    for name in REPLICATED:   # partial: each rank's own rows, and they add up to the sum
        own = [grads_s[name] for _, _, grads_s, _ in partial]
        assert not torch.allclose(own[0], summed[0][2][name])
        torch.testing.assert_close(own[0] + own[1], summed[0][2][name], rtol=0, atol=1e-12)
