"""The DP strategies list their module's parameters once, at ``__init__`` (``FlatStep._params``): a
module's parameters must stay those very objects through training and ``load``, or the kept list
would clear, flatten and re-point stale ones."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from mtb_helpers import run
from mtb_helpers.dp.check import make_problem
from mtb_helpers.dp.fsdp import build_strategy
from mtb_helpers.dp.strategies import flat


def _steps(strategy: str):
    def job():
        model, _, batches = make_problem(4, 6, 10, torch.float64, seed=1, steps=3)
        start = {"params": flat(model.parameters()), "step": 0}
        start.update(exp_avg=torch.zeros_like(start["params"]), exp_avg_sq=torch.zeros_like(start["params"]))
        opt = build_strategy(strategy, model, start, group=dist.new_group([0, 1]))
        r, seen = dist.get_rank(), []
        for i, (x, y) in enumerate(batches):
            if i == 2:
                opt.load(start)           # what a kept capstone stage does at each call
            opt.zero_grad()
            assert all(p.grad is None for p in opt.model.parameters())
            opt.forward_backward(x[2 * r:2 * r + 2], y[2 * r:2 * r + 2])
            opt.reduce_gradients()
            opt.step()
            now = list(opt.model.parameters())
            seen.append(len(now) == len(opt._params) and all(a is b for a, b in zip(now, opt._params)))
            base = opt.flat.untyped_storage().data_ptr()
            seen.append(all(p.untyped_storage().data_ptr() == base for p in now))
        return seen, opt.flat[:opt.layout.numel].clone()
    return job


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2"])
def test_the_kept_parameters_stay_the_modules_own(strategy):
    out = run(_steps(strategy), world_size=2)
    for seen, _ in out:
        assert all(seen)
    assert torch.equal(out[0][1], out[1][1])   # the replicas agree after the steps


def test_full_grads_point_the_modules_grads_into_one_bucket():
    def job():
        model, _, (x, y) = make_problem(4, 6, 10, torch.float64, seed=2)
        start = {"params": flat(model.parameters()), "step": 0}
        start.update(exp_avg=torch.zeros_like(start["params"]), exp_avg_sq=torch.zeros_like(start["params"]))
        opt = build_strategy("ddp", model, start)
        opt.zero_grad()
        opt.forward_backward(x, y)
        own = flat(p.grad for p in opt.model.parameters())
        buffer = opt._full_grads()
        shared = {p.grad.untyped_storage().data_ptr() for p in opt.model.parameters()}
        return torch.equal(buffer[:opt.layout.numel], own), shared == {buffer.untyped_storage().data_ptr()}
    assert run(job, world_size=1) == [(True, True)]


def test_load_puts_the_padded_pieces_in_place():
    """``load`` copies the start state straight in: the same bits as ``layout.piece``'s padded
    copies, on a rank whose shard ends in padding too (136 parameters over 3 ranks: 138)."""
    def job():
        model, _, _ = make_problem(4, 6, 10, torch.float64, seed=4)
        gen = torch.Generator().manual_seed(5)
        start = {"params": flat(model.parameters()), "step": 7}
        start.update({k: torch.rand(len(start["params"]), generator=gen, dtype=torch.float64)
                      for k in ("exp_avg", "exp_avg_sq")})
        opt = build_strategy("zero1", model, start)
        opt.flat.fill_(1.0)                 # what a step would leave behind
        opt.load(start)
        lo, hi = opt.own
        state = opt.optimizer.state[opt.master]
        want = {k: opt.layout.piece(start[k], 0, sharded=False) for k in ("params", "exp_avg", "exp_avg_sq")}
        return (opt.layout.padded_numel - opt.layout.numel, torch.equal(opt.flat, want["params"]),
                all(torch.equal(state[k], want[k][lo:hi]) for k in ("exp_avg", "exp_avg_sq")),
                int(state["step"]))
    out = run(job, world_size=3)
    assert [o[0] for o in out] == [2, 2, 2]
    assert all(o[1:] == (True, True, 7) for o in out)
