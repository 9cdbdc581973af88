"""Deliberately wrong pipeline pieces, for ``check_pipeline(bug=...)`` and ``pipeline_step(bug=...)``.

Each bug is a subclass of ``RankStage`` or ``P2P`` (mtb_helpers.pp.stage / .p2p) overriding one
method, marked ``# BUG``; the runtime builds ``bug.replaces.get(cls, cls)`` for both.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from mtb_helpers.checking.bug import Bug, names_for
from mtb_helpers.pp.p2p import P2P, Message
from mtb_helpers.pp.stage import RankStage


class LossNotScaled(RankStage):
    """pp-loss-not-scaled."""

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss   # BUG: not divided by m, so the loss and every grad are m times too large


class InputGradNotSent(RankStage):
    """pp-input-grad-not-sent."""

    def send_input_grad(self, dx: torch.Tensor, k: int, c: int) -> None:
        # BUG: dx_k is dropped; the previous stage is sent zeros (so it does not hang) and its
        # backward sees no gradient at all
        super().send_input_grad(torch.zeros_like(dx), k, c)


class NewestStash(RankStage):
    """pp-wrong-stash."""

    def stashed(self, k: int, c: int) -> tuple[int, int]:
        # BUG: a stack instead of a queue: the newest stash of the chunk, whichever micro-batch
        return [key for key in self.stash if key[1] == c][-1]


class BlockingSend(P2P):
    """pp-blocking-send."""

    def send(self, tensor: torch.Tensor, msg: Message) -> None:
        self.waiting_for(f"send of the {msg.describe()}")
        # BUG: a blocking send waits until the peer posts the matching receive; under 1F1B both
        # neighbours send first (activation forward, grad backward) and wait for each other forever
        dist.send(tensor.detach().contiguous(), dst=msg.dst, tag=self.tag(msg))


BUGS: dict[str, Bug] = {
    "pp-loss-not-scaled": Bug(
        "pipeline: the last stage does not divide each micro-batch's loss by the micro-batch "
        "count, so the loss and every grad are m times too large",
        checks=("pipeline",), replaces={RankStage: LossNotScaled}),
    "pp-input-grad-not-sent": Bug(
        "pipeline: a stage never sends its input grad upstream (zeros instead), so every stage "
        "but the last gets zero grads",
        checks=("pipeline",), replaces={RankStage: InputGradNotSent}),
    "pp-wrong-stash": Bug(
        "pipeline: backward pops the newest stashed activation instead of its own micro-batch's, "
        "wrong on every stage that holds more than one (all but the last under 1F1B)",
        checks=("pipeline",), replaces={RankStage: NewestStash}),
    "pp-blocking-send": Bug(
        "pipeline: blocking send instead of isend; under 1F1B neighbours both send first and "
        "wait for each other (a deadlock, reported as RankTimeoutError)",
        checks=("pipeline",), replaces={P2P: BlockingSend}),
}
PP_BUGS = names_for(BUGS, "pipeline")
