"""The single-process run every parallel layout must reproduce: AdamW on the whole batch.

Step k: ``ids, targets [s, B] = batch_for_step(k)``; loss = mean cross-entropy over all ``s * B``
positions (measured before the update, as a training loop prints it); backward; one AdamW step.
``Reference.step(k)`` takes it free-running; ``step(k, state)`` re-anchored, from the parallel
run's own parameters and moments, so one step is compared on its own (``check.py``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from mtb_helpers.capstone.data import batch_for_step, corpus, encode
from mtb_helpers.capstone.model import GPTConfig, make_model
from mtb_helpers.dp.strategies import Adam, as_views, flat

__all__ = ["TrainConfig", "train_reference", "Reference"]


@dataclass(frozen=True)
class TrainConfig:
    """The run: steps, global batch B (sequences per step), AdamW's lr and weight decay, seed."""
    steps: int = 5
    batch: int = 8
    lr: float = 1e-2
    weight_decay: float = 0.01
    seed: int = 0

    def adam(self) -> Adam:
        return Adam(lr=self.lr, weight_decay=self.weight_decay, decoupled=True)


class Reference:
    """The one-process model and its AdamW, stepped one step at a time. Its parameters are views
    of one flat vector ``[Ψ]`` (``names`` order) that AdamW steps, as every rank's DP strategy
    does: loading a state or reading the parameters is one copy (AdamW is elementwise: the same
    numbers as per tensor)."""

    def __init__(self, cfg: GPTConfig = GPTConfig(), run: TrainConfig = TrainConfig(),
                 dtype: torch.dtype = torch.float64):
        self.cfg, self.run, self.dtype = cfg, run, dtype
        self.model = make_model(cfg, run.seed, dtype)
        self.names, params = zip(*self.model.named_parameters())
        self.params = params                     # the model's parameters, ``names`` order
        self.shapes = [p.shape for p in params]
        self.flat = flat(params)                 # [Ψ]; the model's parameters become its views
        as_views(params, self.flat)
        self.master = nn.Parameter(self.flat)    # what AdamW steps: the same storage
        self.opt = run.adam().make([self.master])
        self.tokens = encode(corpus())

    def named(self, vec: torch.Tensor) -> dict[str, torch.Tensor]:
        """A flat ``[Ψ]`` vector in ``names`` order as ``{name: view}`` in the model's shapes."""
        parts = vec.split([math.prod(shape) for shape in self.shapes])
        return {n: part.view(shape) for n, part, shape in zip(self.names, parts, self.shapes)}

    def load(self, state: dict) -> None:
        """Parameters and AdamW state ``{"params"|"exp_avg"|"exp_avg_sq": [Ψ], "step": int}``
        (flat vectors in ``names`` order, as ``capstone.state.full_state`` gathers them)."""
        with torch.no_grad():
            self.flat.copy_(state["params"])
        self.opt.state[self.master] = {"step": torch.tensor(float(state["step"])),
                                       **{k: state[k].to(self.dtype).clone()
                                          for k in ("exp_avg", "exp_avg_sq")}}

    def zero_grad(self) -> None:
        """The gradients gone (``model.zero_grad`` without its walk over the modules, ~0.5 ms)."""
        for p in self.params:
            p.grad = None

    def step(self, k: int, state: dict | None = None) -> tuple[float, torch.Tensor]:
        """Step ``k`` (from ``state`` if given): its loss (before the update) and the parameters
        after it, flat ``[Ψ]`` in ``names`` order (``named`` gives them by name)."""
        if state is not None:
            self.load(state)
        ids, targets = batch_for_step(k, self.run.batch, self.cfg.seq, self.tokens)
        self.zero_grad()
        loss = self.model.loss(ids, targets)
        loss.backward()
        self.master.grad = flat(p.grad for p in self.params)   # [Ψ], names order
        self.opt.step()
        return float(loss.detach()), self.flat.clone()


def train_reference(cfg: GPTConfig = GPTConfig(), run: TrainConfig = TrainConfig(),
                    dtype: torch.dtype = torch.float64) -> dict:
    """``{"losses": [float] * steps, "params": {name: tensor}}`` after ``run.steps`` AdamW steps."""
    ref, losses = Reference(cfg, run, dtype), []
    for step in range(run.steps):
        losses.append(ref.step(step)[0])
    return {"losses": losses, "params": ref.named(ref.flat.clone())}
