"""The single-process run every parallel layout must reproduce: AdamW on the whole batch.

Step k: ``ids, targets [s, B] = batch_for_step(k)``; loss = mean cross-entropy over all ``s * B``
positions; backward; one ``torch.optim.AdamW`` step. The loss of step k is measured before its
update, as a training loop prints it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from mtb_helpers.capstone.data import batch_for_step, corpus, encode
from mtb_helpers.capstone.model import GPTConfig, make_model
from mtb_helpers.dp.strategies import Adam

__all__ = ["TrainConfig", "train_reference"]


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


def train_reference(cfg: GPTConfig = GPTConfig(), run: TrainConfig = TrainConfig(),
                    dtype: torch.dtype = torch.float64) -> dict:
    """``{"losses": [float] * steps, "params": {name: tensor}}`` after ``run.steps`` AdamW steps."""
    model = make_model(cfg, run.seed, dtype)
    opt = run.adam().make(model.parameters())
    tokens = encode(corpus())
    losses = []
    for step in range(run.steps):
        ids, targets = batch_for_step(step, run.batch, cfg.seq, tokens)
        opt.zero_grad(set_to_none=True)
        loss = model.loss(ids, targets)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return {"losses": losses,
            "params": {name: p.detach().clone() for name, p in model.named_parameters()}}
