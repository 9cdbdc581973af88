"""Notebook 05 in PyTorch's own API: ``torch.distributed.pipelining`` runs the course's schedules.

    res = pytorch_pipeline(world_size=4, schedule="1f1b", microbatches=8)
    print(res); print(res.summary())

A model of ``p`` blocks (``Linear(h, h)`` then ``tanh``), one block per rank. Rank ``r`` wraps its
block in ``PipelineStage(block, r, p, cpu)`` and runs one step of ``ScheduleGPipe`` or
``Schedule1F1B`` with ``m`` micro-batches and a mean-squared-error loss per micro-batch:

    stage = PipelineStage(block, stage_index=r, num_stages=p, device=torch.device("cpu"))
    sched = Schedule1F1B(stage, n_microbatches=m, loss_fn=F.mse_loss)   # scale_grads=True: / m
    sched.step(x) on rank 0;  sched.step(target=y, losses=losses) on the last;  sched.step() between

Checked on every rank: its block's weight and bias grads against the same model run on one process
on the whole batch (the mean of m equal micro-batch means is the batch mean), the last stage's
micro-batch losses, and the order in which the stage really ran its forwards and backwards (a
forward hook and an autograd tap on the block's output) against the course's
``pp.schedule(name, p, m)`` for that stage: ``op order`` counts the ops out of place, tolerance 0.
The point-to-point messages are counted per rank (``c10d.send`` / ``c10d.recv_``, seen by a
dispatch mode: ``CommDebugMode`` counts collectives only) next to what the schedule implies:
``m`` activations forward and ``m`` grads backward across every boundary.
"""
from __future__ import annotations

import copy
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from mtb_helpers.checking.agreement import Agreement, agreement
from mtb_helpers.checking.bug import Bug, resolve, swap
from mtb_helpers.checking.tolerances import divisible, positive_sizes
from mtb_helpers.pp.schedules import schedule as course_schedule
from mtb_helpers.runtime.ranks import resolve_world_size, run

__all__ = ["pytorch_pipeline", "pp_on_rank", "torch_schedule", "make_blocks"]

PP_SCHEDULES = ("gpipe", "1f1b")
_MAP = [("stage r: the blocks of rank r", "PipelineStage(block, r, p, device)"),
        ("schedule('gpipe') / schedule('1f1b')", "ScheduleGPipe / Schedule1F1B(stage, m, loss_fn)"),
        ("loss = mean over micro-batches", "scale_grads=True: grads / m"),
        ("send/recv to the neighbouring stage", "stage p2p: batch_isend_irecv")]


def make_blocks(stages: int, hidden: int, seed: int) -> nn.Sequential:
    """``stages`` blocks ``Sequential(Linear(h, h), Tanh())`` in float64, weights ~ N(0, 1/h)."""
    gen = torch.Generator().manual_seed(seed)
    blocks = []
    for _ in range(stages):
        lin = nn.Linear(hidden, hidden, dtype=torch.float64)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(hidden, hidden, generator=gen, dtype=torch.float64)
                             / hidden ** 0.5)
            lin.bias.copy_(0.1 * torch.randn(hidden, generator=gen, dtype=torch.float64))
        blocks.append(nn.Sequential(lin, nn.Tanh()))
    return nn.Sequential(*blocks)


class _Tap(torch.autograd.Function):
    """forward: identity on the block's output; backward: note that the stage's B ran."""

    @staticmethod
    def forward(ctx, y, log):
        ctx.log = log
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad):
        ctx.log.append("B")
        return grad, None


class _Logged(nn.Module):
    """The stage's block, noting each forward ("F") and each backward ("B") in run order."""

    def __init__(self, block: nn.Module, log: list):
        super().__init__()
        self.block, self.log = block, log

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.log.append("F")
        return _Tap.apply(self.block(x), self.log)


def torch_schedule(name: str, stage, microbatches: int, scale_grads: bool = True):
    """PyTorch's schedule ``name`` ("gpipe" or "1f1b") for one ``PipelineStage``: a mean-squared
    error per micro-batch, the grads divided by the micro-batch count (``scale_grads``)."""
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[name]
    return cls(stage, microbatches, loss_fn=F.mse_loss, scale_grads=scale_grads)


def _p2p_counter():
    from mtb_helpers.runtime.compat import dispatch_mode

    class P2PCount(dispatch_mode()):
        """Counts the point-to-point ops every rank issues (send, recv)."""

        def __init__(self):
            super().__init__()
            self.counts: dict[str, int] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func.overloadpacket.__name__)
            if name in ("send", "recv_"):
                key = name.rstrip("_")
                self.counts[key] = self.counts.get(key, 0) + 1
            return func(*args, **(kwargs or {}))
    return P2PCount()


def _numbered(kinds: list[str]) -> list[str]:
    """``["F", "F", "B"]`` -> ``["F0", "F1", "B0"]``: both schedules take micro-batches in order."""
    return [f"{k}{kinds[:i].count(k)}" for i, k in enumerate(kinds)]


def pp_on_rank(model: nn.Sequential, x: torch.Tensor, y: torch.Tensor, name: str,
               microbatches: int, bug: Bug | None = None) -> dict:
    """Run on every rank: stage ``rank`` of ``model`` through PyTorch's schedule; the grads of its
    block, the run order, the p2p counts, and the same block's grads on one process."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    r, p = dist.get_rank(), dist.get_world_size()
    full = copy.deepcopy(model)                  # the one-process reference: the whole model
    mb_losses = [F.mse_loss(full(xm), ym) for xm, ym in zip(x.chunk(microbatches),
                                                             y.chunk(microbatches))]
    torch.stack(mb_losses).mean().backward()
    course = {"weight_grad": full[r][0].weight.grad, "bias_grad": full[r][0].bias.grad}
    if r == p - 1:
        course["losses"] = torch.stack([l.detach() for l in mb_losses])

    log: list[str] = []
    block = _Logged(copy.deepcopy(model[r]), log)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stage = PipelineStage(block, r, p, torch.device("cpu"))
        sched = swap(bug, torch_schedule)(name, stage, microbatches)
        # The first step also infers the stage's shapes (one forward and backward on empty
        # tensors, metadata sent along): it is the warm-up; the second one is compared.
        for _ in range(2):
            block.zero_grad(set_to_none=True)
            log.clear()
            losses: list = []
            with _p2p_counter() as p2p:
                if r == 0:
                    sched.step(x)
                elif r == p - 1:
                    sched.step(target=y, losses=losses)
                else:
                    sched.step()
    lin = block.block[0]
    got = {"weight_grad": lin.weight.grad.detach().clone(), "bias_grad": lin.bias.grad.detach().clone()}
    if r == p - 1:
        got["losses"] = torch.stack([l.detach() for l in losses])
    ran = _numbered(log)
    planned = [f"{op.kind}{op.microbatch}" for op in course_schedule(name, stages=p,
                                                                      microbatches=microbatches)[r]]
    out_of_place = sum(a != b for a, b in zip(ran, planned)) + abs(len(ran) - len(planned))
    got["op order"], course["op order"] = torch.tensor([float(out_of_place)]), torch.zeros(1)
    sends = (r > 0) * microbatches, (r < p - 1) * microbatches   # grads back, activations on
    counts = {"p2p": (p2p.counts, {k: sum(sends) for k in ("send", "recv") if sum(sends)})}
    return {"torch": got, "course": course, "counts": counts, "ran": ran, "planned": planned}


def pytorch_pipeline(world_size: int = 4, schedule: str = "1f1b", microbatches: int = 8,
                     batch: int = 16, hidden: int = 4, seed: int = 0, bug: str | None = None,
                     timeout: float = 60.0) -> Agreement:
    """One step of ``ScheduleGPipe`` / ``Schedule1F1B`` on ``world_size`` stages: grads against
    one process, run order against ``pp.schedule``, p2p messages per rank."""
    p = resolve_world_size(world_size)
    if schedule not in PP_SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; PyTorch's single-stage schedules here "
                         f"are {PP_SCHEDULES}")
    wrong = resolve(bug, "pytorch_pipeline")
    positive_sizes(microbatches=microbatches, batch=batch, hidden=hidden)
    if p < 2:
        raise ValueError(f"a pipeline needs at least 2 stages (one per rank), got world_size={p}")
    divisible("batch", batch, f"microbatches={microbatches}", microbatches,
              "every micro-batch must have the same size")
    model = make_blocks(p, hidden, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    x, y = (torch.randn(batch, hidden, generator=gen, dtype=torch.float64) for _ in range(2))
    results = run(pp_on_rank, model, x, y, schedule, microbatches, wrong, world_size=p,
                  timeout=timeout)
    notes = [f"stage {r}: ran {' '.join(res['ran'])}" + ("" if res["ran"] == res["planned"] else
             f"; course schedule {' '.join(res['planned'])}") for r, res in enumerate(results)]
    label = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}[schedule]
    res = agreement(f"{label}, {microbatches} micro-batches", results, _MAP, bug, tuple(notes))
    res.tolerances["op order"] = 0.0
    # the end stages talk to one neighbour, the middle ones to two: every stage's counts
    res.counts = {f"stage {r}": results[r]["counts"]["p2p"] for r in range(p)}
    res.notes = notes
    res.sources = ("PyTorch (c10d send/recv)", "course (pp.schedule implies)")
    return res
