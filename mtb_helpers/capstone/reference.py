"""The single-process run every parallel layout must reproduce: AdamW on the whole batch.

Step k: ``ids, targets [s, B] = batch_for_step(k)``; loss = mean cross-entropy over all ``s * B``
positions; backward; one ``torch.optim.AdamW`` step. The loss of step k is measured before its
update, as a training loop prints it.

``Reference`` takes the same steps one at a time. Free-running (``step(k)``) it is the run above;
re-anchored (``step(k, state)``) it first takes the parallel run's own parameters and AdamW
moments, so one step is compared on its own: a wrong step shows at once, and rounding
differences (another summation order over ranks and micro-batches, ~1e-16 in fp64) cannot
compound through AdamW over hundreds of steps as they do between two free-running runs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from mtb_helpers.capstone.data import batch_for_step, corpus, encode
from mtb_helpers.capstone.model import GPTConfig, make_model
from mtb_helpers.dp.strategies import Adam

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
    """The one-process model and its AdamW, stepped one step at a time."""

    def __init__(self, cfg: GPTConfig = GPTConfig(), run: TrainConfig = TrainConfig(),
                 dtype: torch.dtype = torch.float64):
        self.cfg, self.run, self.dtype = cfg, run, dtype
        self.model = make_model(cfg, run.seed, dtype)
        self.opt = run.adam().make(self.model.parameters())
        self.tokens = encode(corpus())

    def load(self, state: dict) -> None:
        """Parameters and AdamW state ``{"params"|"exp_avg"|"exp_avg_sq": {name: tensor},
        "step": int}`` (full tensors, named as in the one-process model)."""
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                p.copy_(state["params"][name])
                self.opt.state[p] = {"step": torch.tensor(float(state["step"])),
                                     **{k: state[k][name].to(self.dtype).clone()
                                        for k in ("exp_avg", "exp_avg_sq")}}

    def step(self, k: int, state: dict | None = None) -> tuple[float, dict[str, torch.Tensor]]:
        """Step ``k`` (from ``state`` if given): its loss (before the update) and the parameters
        after it."""
        if state is not None:
            self.load(state)
        ids, targets = batch_for_step(k, self.run.batch, self.cfg.seq, self.tokens)
        self.opt.zero_grad(set_to_none=True)
        loss = self.model.loss(ids, targets)
        loss.backward()
        self.opt.step()
        params = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        return float(loss.detach()), params


def train_reference(cfg: GPTConfig = GPTConfig(), run: TrainConfig = TrainConfig(),
                    dtype: torch.dtype = torch.float64) -> dict:
    """``{"losses": [float] * steps, "params": {name: tensor}}`` after ``run.steps`` AdamW steps."""
    ref, losses, params = Reference(cfg, run, dtype), [], None
    for step in range(run.steps):
        loss, params = ref.step(step)
        losses.append(loss)
    if params is None:
        params = {n: p.detach().clone() for n, p in ref.model.named_parameters()}
    return {"losses": losses, "params": params}
