"""The pipeline on real ranks: one training step of an ``nn.Sequential`` cut into stages.

    from mtb_helpers.pp import pipeline_step
    res = pipeline_step(model, x, target, loss_fn=F.mse_loss, schedule="1f1b", stages=4,
                        microbatches=8)
    res.loss, res.grads, res.timeline, res.peak_stashed, res.records

The model's layers are cut into ``stages * chunks`` consecutive pieces; rank r holds pieces
r, r+p, ... (Megatron-LM's interleaved layout). ``x`` and ``target`` are cut into ``microbatches``
along dim 0. Every rank runs exactly ``schedule(name, stages, microbatches, chunks)[rank]``, the
same op list the simulator times (see :mod:`mtb_helpers.pp.stage` for what each op does and
:mod:`mtb_helpers.pp.p2p` for why the sends and receives cannot deadlock).

``op_time=(F, B)`` or ``(F, I, W)`` (seconds per micro-batch on a whole stage; a chunk takes 1/v
of it, as in ``simulate``) holds every op until its fixed time has passed, the way a GPU kernel
takes fixed time, so the measured timeline shows the schedule rather than this machine's core
count. With ``recompute=True`` a backward (or I) also pays one forward: F + B.
"""
from __future__ import annotations

import copy
import math
import os
import shutil
import tempfile
import time
from collections import OrderedDict
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from mtb_helpers.checking.bug import resolve, swap
from mtb_helpers.comm.records import record
from mtb_helpers.pp.p2p import P2P
from mtb_helpers.pp.schedules import Schedule
from mtb_helpers.pp.schedules import schedule as make_schedule
from mtb_helpers.pp.result import PipelineResult
from mtb_helpers.pp.simulator import TimelineEvent, simulate
from mtb_helpers.pp.stage import RankStage, pad
from mtb_helpers.runtime.errors import RankTimeoutError
from mtb_helpers.runtime.ranks import in_launched_job, run

__all__ = ["pipeline_step", "PipelineResult", "split_model", "op_durations", "simulated_for"]


def split_model(model: nn.Sequential, pieces: int) -> list[nn.Sequential]:
    """``pieces`` consecutive slices of ``model``'s layers, keeping each parameter's full name."""
    if not isinstance(model, nn.Sequential):
        raise ValueError(f"model must be an nn.Sequential (its layers are cut into stages), got "
                         f"{type(model).__name__}")
    n = len(model)
    if n == 0:
        raise ValueError("model is an empty nn.Sequential: it has no layers to cut into stages")
    if n % pieces:
        raise ValueError(f"the model has {n} layers, which do not divide into stages x chunks = "
                         f"{pieces} pieces of equal length")
    size = n // pieces
    names = list(model._modules)
    return [nn.Sequential(OrderedDict((name, model._modules[name])
                                      for name in names[i * size:(i + 1) * size]))
            for i in range(pieces)]


def op_durations(op_time, chunks: int, recompute: bool) -> dict[str, float] | None:
    """Seconds per op kind for one chunk: (F, B) or (F, I, W), divided by ``chunks``; a backward
    (or I) also pays the re-run forward when recomputing."""
    if op_time is None:
        return None
    try:
        values = [] if isinstance(op_time, (str, bytes)) else [float(t) for t in op_time]
    except (TypeError, ValueError):
        values = []
    if len(values) not in (2, 3) or any(not 0 <= t < math.inf for t in values) or not (
            values[0] > 0 and sum(values[1:]) > 0):
        raise ValueError(f"op_time must be (F, B) or (F, I, W) finite seconds >= 0, with F and "
                         f"the backward > 0, got {op_time!r}")
    f, i, w = (values[0], values[1] / 2, values[1] / 2) if len(values) == 2 else values
    extra = f if recompute else 0.0
    return {"F": f / chunks, "B": (i + w + extra) / chunks, "I": (i + extra) / chunks,
            "W": w / chunks}


def simulated_for(schedule: str | Schedule, stages: int, microbatches: int, chunks: int, op_time=None,
                  recompute: bool = False, latency: float = 0.0):
    """``simulate()`` of the same schedule (its name, or the ``Schedule`` the ranks run) with the
    same op times (F=1, B=2 when none; a recomputing backward pays F + B); ``latency``: seconds
    each message between ranks takes (e.g. ``PipelineResult.hop_latency``, this machine's hop)."""
    ops = (schedule if isinstance(schedule, Schedule)
           else make_schedule(schedule, stages, microbatches, chunks))
    d = op_durations(op_time, 1, recompute) or {"F": 1.0, "I": 1.0, "W": 1.0}
    return simulate(ops, d["F"], d["I"] + d["W"], input=d["I"], weight=d["W"], latency=latency)


def _check_makespan(ops, op_time, recompute: bool, timeout: float) -> None:
    """ValueError unless padded ops can finish within ``timeout``: no step is shorter than its
    schedule's simulated makespan, and a longer one would only be reported as a hang."""
    if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
            or not 0 < timeout < math.inf):
        raise ValueError(f"timeout must be a positive, finite number of seconds, got {timeout!r}")
    if op_time is None:
        return
    makespan = simulated_for(ops, ops.stages, ops.microbatches, ops.chunks, op_time, recompute).makespan
    if makespan >= timeout:
        raise ValueError(f"op_time={tuple(op_time)!r} cannot finish within timeout={timeout:g} s: "
                         f"padded ops alone take {makespan:g} s (the schedule's simulated "
                         f"makespan); lower op_time or raise timeout")


def _validate(model, x, target, schedule, stages, microbatches, chunks) -> list:
    ops = make_schedule(schedule, stages, microbatches, chunks)   # refuses bad sizes and names
    pieces = split_model(model, stages * chunks)
    for name, value in (("x", x), ("target", target)):
        if not isinstance(value, torch.Tensor) or value.dim() < 1:
            raise ValueError(f"{name} must be a tensor with a batch dim first, got "
                             f"{type(value).__name__}")
    if x.shape[0] % microbatches:
        raise ValueError(f"the batch of {x.shape[0]} rows does not divide into microbatches="
                         f"{microbatches} equal micro-batches")
    if target.shape[0] != x.shape[0]:
        raise ValueError(f"target has {target.shape[0]} rows but x has {x.shape[0]}")
    return ops, pieces


def _boundary_inputs(pieces: list[nn.Module], x_k: torch.Tensor) -> list[tuple[torch.Size, torch.dtype]]:
    """Shape and dtype of the tensor entering each virtual stage (what its receive expects).

    It runs every piece forward and backward once, with grads taken by ``autograd.grad`` so no
    ``.grad`` changes: a fresh rank process pays its one-off autograd start-up (hundreds of
    milliseconds on a loaded machine) here, before the clock starts, not inside the first B."""
    inputs = []
    for piece in pieces:
        inputs.append((x_k.shape, x_k.dtype))
        x_k = x_k.detach().requires_grad_()
        out = piece(x_k)
        # with an explicit output grad, as B does: the first such call in a process is slow
        torch.autograd.grad(out, [x_k, *piece.parameters()], torch.ones_like(out),
                            allow_unused=True)
        x_k = out.detach()
    return inputs


def _on_rank(pieces, x, target, loss_fn, ops, op_time, recompute, bug, status_dir) -> dict:
    """Run on every rank: this rank's op list of one pipeline step, timed on one clock."""
    r, p = dist.get_rank(), dist.get_world_size()
    m, v = ops.microbatches, ops.chunks
    mine = {c: pieces[c * p + r] for c in range(v)}
    for piece in mine.values():
        piece.zero_grad(set_to_none=True)
    status = None if status_dir is None else os.path.join(status_dir, f"rank{r}.p2p")
    p2p = swap(bug, P2P)(p * v, m, time.perf_counter, status)
    stage = swap(bug, RankStage)(r, p, m, mine, list(x.chunk(m)), list(target.chunk(m)), loss_fn, p2p,
                            _boundary_inputs(pieces, x.chunk(m)[0]), recompute)
    run_op = {"F": stage.forward, "B": stage.backward, "I": stage.input_grad, "W": stage.weight_grad}
    durations = op_durations(op_time, v, recompute)
    events = []
    current: dict = {}

    def begin() -> float:
        # a receive inside the op is waiting, not computing: the op starts when it arrives
        recvs = [e[3] for e in p2p.events[current["before"]:] if e[0] == "recv"]
        return max([current["start"]] + recvs)

    def pace() -> None:
        # the first call ends the op (before its send leaves); later calls find it ended
        if "end" not in current:
            pad(begin(), durations[current["kind"]])
            current["end"] = time.perf_counter()

    if durations is not None:
        stage.pace = pace
        for op in ops[r]:   # every receive posted before the clock starts (see pp.p2p)
            for shape, dtype, msg in stage.receives(op):
                p2p.expect(shape, dtype, msg)
    dist.barrier()
    try:
        with record() as rec:
            zero = end = time.perf_counter()
            for op in ops[r]:
                # with fixed op times the rank is free when its previous op ended, as a GPU stream
                # is: posting that op's send and this bookkeeping happen inside this op's time
                current.clear()
                current.update(kind=op.kind, before=len(p2p.events),
                               start=time.perf_counter() if durations is None else end)
                run_op[op.kind](op.microbatch, op.chunk)
                stage.computed()
                end = current.get("end", time.perf_counter())
                events.append((op.kind, op.microbatch, op.chunk, begin(), end, None, None))
            p2p.finish()
    finally:
        p2p.close()   # also when an op raised: the rank process serves later calls
    for kind, msg, start, end in p2p.events:
        peer = msg.dst if kind == "send" else msg.src
        events.append((kind, msg.microbatch, msg.sender // p, start, end, peer, p2p.tag(msg)))
    grads = {name: prm.grad for piece in mine.values() for name, prm in piece.named_parameters()}
    return {"zero": zero, "events": events, "grads": grads, "losses": stage.losses,
            "peak_stashed": stage.peak_stashed, "peak_bytes": stage.peak_bytes,
            "recomputed_bytes": stage.recomputed_bytes, "record": rec.without_tensors()}


def pipeline_step(model: nn.Sequential, x: torch.Tensor, target: torch.Tensor,
                  loss_fn: Callable = torch.nn.functional.mse_loss, schedule: str = "1f1b",
                  stages: int = 4, microbatches: int = 8, chunks: int = 1, op_time=None,
                  recompute: bool = False, bug=None, timeout: float = 60.0,
                  link=None) -> PipelineResult:
    """One forward and backward of ``model`` on ``x`` [b, ...] run as a pipeline on ``stages``
    gloo ranks; ``loss_fn(out_k, target_k)`` must average over its micro-batch (the last stage
    divides it by ``microbatches``, so the losses add up to the whole batch's mean).

    ``bug`` names a deliberate bug of ``mtb_helpers.pp.bugs`` (its wrong classes stand in for
    RankStage / P2P). Raises ValueError (before any rank starts) when the
    layer count does not divide into stages x chunks, the batch into micro-batches, or a size is
    bad; ``RankTimeoutError`` naming each rank's blocked p2p op and peer if the step hangs.
    ``link=`` (``mtb_helpers.cost.Link``) makes every message take its modelled time too.
    """
    stages = int(os.environ["WORLD_SIZE"]) if in_launched_job() else stages
    ops, pieces = _validate(model, x, target, schedule, stages, microbatches, chunks)
    bug = resolve(bug, "pipeline", op_time=op_time)
    _check_makespan(ops, op_time, recompute, timeout)
    if in_launched_job():   # the ranks run on these very pieces: the caller's model stays untouched
        pieces = [copy.deepcopy(piece) for piece in pieces]
    status_dir = None if in_launched_job() else tempfile.mkdtemp(prefix="mtb-pp-")
    try:
        results = run(_on_rank, pieces, x.detach(), target.detach(), loss_fn, ops, op_time,
                      recompute, bug, status_dir, world_size=stages, timeout=timeout, link=link)
    except RankTimeoutError as exc:
        raise RankTimeoutError(str(exc) + _blocked_on(status_dir, exc), exc.finished,
                               exc.waiting) from None
    finally:
        if status_dir is not None:
            shutil.rmtree(status_dir, ignore_errors=True)
    zero = min(res["zero"] for res in results)
    timeline = sorted((TimelineEvent(r, kind, k, c, start - zero, end - zero, peer, tag)
                       for r, res in enumerate(results)
                       for kind, k, c, start, end, peer, tag in res["events"]),
                      key=lambda e: (e.start, e.rank))
    grads = {name: g for res in results for name, g in res["grads"].items()}
    order = [name for name, _ in model.named_parameters()]
    config = {"schedule": schedule, "stages": stages, "microbatches": microbatches,
              "chunks": ops.chunks, "op_time": None if op_time is None else list(op_time),
              "recompute": recompute}
    return PipelineResult(
        loss=sum(sum(res["losses"].values()) for res in results),
        grads={name: grads[name] for name in order},
        timeline=timeline, peak_stashed=[res["peak_stashed"] for res in results],
        records=[res["record"] for res in results], schedule=ops,
        stash_bytes=[res["peak_bytes"] for res in results],
        recompute_bytes=[res["recomputed_bytes"] for res in results], config=config)


def _blocked_on(status_dir: str | None, exc: RankTimeoutError) -> str:
    """What each rank still waiting had said it was about to block on."""
    if status_dir is None:
        return ""
    lines = []
    for r in sorted(exc.waiting):
        try:
            with open(os.path.join(status_dir, f"rank{r}.p2p")) as f:
                said = f.read()
            if said:   # empty: its last wait had completed
                lines.append(f"  rank {r} was blocked in the {said}")
        except OSError:
            pass
    return ("\nPoint-to-point ops the ranks were blocked in:\n" + "\n".join(lines)) if lines else ""
