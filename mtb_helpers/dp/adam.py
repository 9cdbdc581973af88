"""Adam and AdamW written out: the update ``torch.optim.Adam`` / ``AdamW`` make on CPU, op for op.

Per parameter ``p`` with gradient ``g``, at step ``t`` (Kingma & Ba 2015; decoupled weight decay:
Loshchilov & Hutter 2019):

    AdamW: p <- p (1 - lr wd)            Adam (L2): g <- g + wd p
    m <- m + (1 - b1) (g - m)            (m.lerp_(g, 1 - b1))
    v <- b2 v + (1 - b2) g g
    p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

These are the operations of torch's single-tensor implementation (what it runs on CPU), in its
order, so the results are the same bits (tests/test_capstone.py, tests/test_dp*.py hold them equal
to ``torch.optim``'s). Written out because ``torch.optim``'s first step imports ``torch._dynamo``
and ``torch._inductor`` (~0.8 s on one CPU, ~30 MiB in every process that steps): the course's
strategies (``ShardedOptimizer`` too, under notebook 06's ZeRO-1/2) and the capstone's reference
step without it; the comparisons with PyTorch keep ``torch.optim`` on PyTorch's side
(``Adam.torch_optimizer``). Which modules' ranks step
``torch.optim`` (and so have ``torch._dynamo`` preloaded) is runtime/start.py's
``HEAVY_RANK_IMPORTS``, the one place that decides what ranks preload and says why.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Adam", "AdamUpdate"]


class AdamUpdate:
    """An optimizer over ``params`` (tensors, or ``torch.optim``-style groups: dicts with
    ``"params"`` and any hyper-parameter of their own) with ``torch.optim``'s interface as the
    course uses it: ``param_groups``, ``step()``, ``zero_grad()`` and ``state[p]`` =
    ``{"step": tensor, "exp_avg", "exp_avg_sq"}`` (made as torch makes it at a parameter's first
    step; a caller may put its own there). ``ShardedOptimizer`` takes the class as its local
    optimizer, as it takes ``torch.optim.AdamW``."""

    def __init__(self, params, lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float, decoupled: bool):
        params = list(params)
        groups = params if params and isinstance(params[0], dict) else [{"params": params}]
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                    "decoupled": decoupled}
        self.param_groups = [{**defaults, **g, "params": list(g["params"])} for g in groups]
        self.state: dict = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state.get(p)
                if state is None:
                    state = self.state[p] = {"step": torch.tensor(0.0),
                                             "exp_avg": torch.zeros_like(p),
                                             "exp_avg_sq": torch.zeros_like(p)}
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                state["step"] += 1
                if wd != 0:
                    if group["decoupled"]:
                        p.mul_(1 - lr * wd)
                    else:
                        grad = grad.add(p, alpha=wd)
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                step = state["step"].item()
                step_size = lr / (1 - beta1 ** step)
                denom = (exp_avg_sq.sqrt() / (1 - beta2 ** step) ** 0.5).add_(group["eps"])
                p.addcdiv_(exp_avg, denom, value=-step_size)


@dataclass(frozen=True)
class Adam:
    """Adam's hyper-parameters (``torch.optim.Adam``, L2 weight decay added to the grad; with
    ``decoupled=True`` ``torch.optim.AdamW``, the decay applied to the weights directly)."""
    lr: float = 1e-2
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled: bool = False

    def make(self, params) -> AdamUpdate:
        """The course's optimizer: the update above, written out, bit for bit."""
        return AdamUpdate(params, self.lr, self.betas, self.eps, self.weight_decay, self.decoupled)

    def torch_optimizer(self, params) -> torch.optim.Optimizer:
        """PyTorch's own, for the side of a comparison that is PyTorch's (and references that
        check the course's update against it)."""
        cls = torch.optim.AdamW if self.decoupled else torch.optim.Adam
        return cls(params, lr=self.lr, betas=self.betas, eps=self.eps,
                   weight_decay=self.weight_decay)
