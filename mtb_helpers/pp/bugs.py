"""Deliberately wrong pipeline pieces, for ``check_pipeline(bug=...)`` and ``pipeline_step(bug=...)``.

Each bug is a subclass of ``RankStage`` or ``P2P`` (mtb_helpers.pp.stage / .p2p) overriding one
method, marked ``# BUG``; the runtime builds ``swap(bug, cls)`` for both. The last two set
PyTorch's schedule up wrongly in the comparison of ``pp/pytorch.py``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from mtb_helpers.checking.bug import Bug, register
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


def schedule_without_scaling(name: str, stage, microbatches: int):
    """scale-grads-off."""
    from mtb_helpers.pp.pytorch import torch_schedule
    # BUG: each micro-batch's loss is a mean already; unscaled, the grads are m times too large
    return torch_schedule(name, stage, microbatches, scale_grads=False)


def the_other_schedule(name: str, stage, microbatches: int):
    """other-schedule."""
    from mtb_helpers.pp.pytorch import torch_schedule
    # BUG: 1F1B runs where GPipe is compared, or GPipe where 1F1B is: same grads, other order
    return torch_schedule({"gpipe": "1f1b", "1f1b": "gpipe"}[name], stage, microbatches)


TORCH_SCHEDULE = "mtb_helpers.pp.pytorch.torch_schedule"   # by name: see checking.bug.swap

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
        checks=("pipeline",), replaces={P2P: BlockingSend},
        # with fixed op times every receive is posted before the step (pp.p2p): nothing to block
        needs={"op_time=None (with fixed op times the ranks post every receive ahead, so a "
               "blocking send finds its receive)": lambda a: a["op_time"] is None}),
    "scale-grads-off": Bug(
        "PyTorch's schedule: scale_grads=False with a mean loss per micro-batch, so the grads are "
        "m times too large", checks=("pytorch_pipeline",),
        replaces={TORCH_SCHEDULE: schedule_without_scaling}),
    "other-schedule": Bug(
        "PyTorch's schedule: the other one (1F1B for GPipe, GPipe for 1F1B) than the one "
        "compared with, so the order of the ops differs", checks=("pytorch_pipeline",),
        replaces={TORCH_SCHEDULE: the_other_schedule}),
}

register("pp", BUGS)   # at import: see checking/bug.py
