"""The course's written-out Adam / AdamW (dp/adam.py) against torch.optim's, bit for bit."""
from __future__ import annotations

import pytest
import torch

from mtb_helpers.dp.adam import AdamUpdate
from mtb_helpers.dp.strategies import Adam


def _steps(make, dtype, steps=5):
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(7, 5, generator=gen, dtype=dtype).requires_grad_(),
              torch.randn(5, generator=gen, dtype=dtype).requires_grad_()]
    opt = make(params)
    out = []
    for k in range(steps):
        opt.zero_grad()
        loss = sum(((p * (k + 1)) ** 2).sum() for p in params)   # a different gradient each step
        loss.backward()
        opt.step()
        out.append([p.detach().clone() for p in params])
    return out


class NoBiasCorrection(AdamUpdate):
    """The deliberate mistake: Adam's bias correction left out (the first steps are far too small)."""

    @torch.no_grad()
    def step(self):
        group = self.param_groups[0]
        (beta1, beta2), lr, wd = group["betas"], group["lr"], group["weight_decay"]
        for p in group["params"]:
            state = self.state.setdefault(p, {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                                              "exp_avg_sq": torch.zeros_like(p)})
            state["step"] += 1
            grad = p.grad if group["decoupled"] else p.grad.add(p, alpha=wd)
            if group["decoupled"]:
                p.mul_(1 - lr * wd)
            state["exp_avg"].lerp_(grad, 1 - beta1)
            state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            p.addcdiv_(state["exp_avg"], state["exp_avg_sq"].sqrt().add_(group["eps"]), value=-lr)


class MomentsNotCarried(AdamUpdate):
    """The deliberate mistake in what carries over: each step starts from fresh moments and step
    count (a state kept per call, not per parameter), so step 1 is right and every later one wrong."""

    def step(self):
        self.state.clear()
        super().step()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("decoupled", [True, False])
def test_the_written_out_update_is_torch_optims_bit_for_bit(dtype, decoupled):
    adam = Adam(lr=1e-2, weight_decay=0.1, decoupled=decoupled)
    theirs = _steps(adam.torch_optimizer, dtype)
    ours = _steps(adam.make, dtype)
    assert isinstance(adam.make([]), AdamUpdate)
    assert isinstance(adam.torch_optimizer([torch.zeros(1, requires_grad=True)]), torch.optim.Optimizer)
    assert all(torch.equal(a, b) for step_a, step_b in zip(ours, theirs) for a, b in zip(step_a, step_b))
    wrong = _steps(lambda ps: NoBiasCorrection(ps, adam.lr, adam.betas, adam.eps, adam.weight_decay,
                                               decoupled), dtype)
    assert not torch.equal(wrong[0][0], theirs[0][0])
    forgetful = _steps(lambda ps: MomentsNotCarried(ps, adam.lr, adam.betas, adam.eps,
                                                    adam.weight_decay, decoupled), dtype)
    same = [all(torch.equal(a, b) for a, b in zip(f, t)) for f, t in zip(forgetful, theirs)]
    assert same == [True] + [False] * (len(theirs) - 1), same   # caught from step 2 on


def test_a_state_put_in_by_the_caller_is_where_the_next_step_starts():
    """DP strategies and the capstone's reference resume from a snapshot by writing ``state[p]``."""
    p = torch.ones(3, dtype=torch.float64, requires_grad=True)
    q = p.detach().clone().requires_grad_()
    start = {"step": torch.tensor(4.0), "exp_avg": torch.full((3,), 0.5, dtype=torch.float64),
             "exp_avg_sq": torch.full((3,), 0.25, dtype=torch.float64)}
    ours, theirs = Adam(decoupled=True).make([p]), Adam(decoupled=True).torch_optimizer([q])
    ours.state[p] = {k: v.clone() for k, v in start.items()}
    theirs.state[q] = {k: v.clone() for k, v in start.items()}
    for x in (p, q):
        x.grad = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    ours.step()
    theirs.step()
    assert torch.equal(p, q) and float(ours.state[p]["step"]) == 5.0


def test_groups_with_their_own_hyper_parameters_step_as_torch_optims_do():
    """ShardedOptimizer hands its local optimizer torch-style groups (a scheduler's lr per group)."""
    adam = Adam(lr=1e-2, weight_decay=0.1, decoupled=True)
    kw = {"betas": adam.betas, "eps": adam.eps, "weight_decay": adam.weight_decay}

    def grouped(cls, **extra):
        return lambda ps: cls([{"params": ps[:1], "lr": 0.05}, {"params": ps[1:]}], lr=adam.lr, **kw, **extra)
    theirs = _steps(grouped(torch.optim.AdamW), torch.float64)
    ours = _steps(grouped(AdamUpdate, decoupled=True), torch.float64)
    assert all(torch.equal(a, b) for step_a, step_b in zip(ours, theirs) for a, b in zip(step_a, step_b))
    one_lr = _steps(adam.make, torch.float64)   # the group's own lr is used: not the default's steps
    assert not torch.equal(ours[0][0], one_lr[0][0]) and torch.equal(ours[0][1], one_lr[0][1])
