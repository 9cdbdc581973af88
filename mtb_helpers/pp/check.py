"""The pipeline check: one step of ``pipeline_step`` on real ranks against one process.

    report = check_pipeline("1f1b", stages=4, microbatches=8, dtype=torch.float64)

The model is ``stages * chunks`` blocks of Linear(h, h) + GELU (``make_pipeline_model``); X and
the target are ``[rows_per_microbatch * m, h]`` drawn from ``seed``. The reference runs the whole
model on the whole batch in one process (MSE, mean over the batch) in the run's dtype and in
float64. Rows: the loss (on the last rank) and every parameter's grad on the rank that holds it.
``extra["pipeline"]`` holds the measured timeline, peak stashes next to the simulator's, bytes
held and the measured and simulated bubble.
"""
from __future__ import annotations

import copy
import functools

import torch
import torch.nn.functional as F
from torch import nn

from mtb_helpers.checking.report import Report, compare
from mtb_helpers.checking.tolerances import as_dtype, check_config, positive_sizes
from mtb_helpers.pp.runtime import pipeline_step, simulated_for, split_model
from mtb_helpers.runtime.ranks import resolve_world_size

__all__ = ["INTERLEAVED_CHUNKS", "check_pipeline", "make_pipeline_model", "reference_step",
           "simulated_for"]

# model chunks per rank when ``check_pipeline`` is asked for interleaved without ``chunks``; the
# explorer on ranks reads it too, to hold each chunk's op to its op time
INTERLEAVED_CHUNKS = 2


def make_pipeline_model(blocks: int, width: int = 8, dtype: torch.dtype = torch.float32,
                        seed: int = 0) -> nn.Sequential:
    """``blocks`` x (Linear(width, width), GELU) as one ``nn.Sequential`` (2 * blocks layers)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers: list[nn.Module] = []
        for _ in range(blocks):
            layers += [nn.Linear(width, width, dtype=dtype), nn.GELU()]
        return nn.Sequential(*layers)


def reference_step(model: nn.Sequential, x: torch.Tensor, target: torch.Tensor,
                   loss_fn=F.mse_loss) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and grads of one process on the whole batch (the model is copied, not touched)."""
    model = copy.deepcopy(model)
    loss = loss_fn(model(x), target)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@functools.lru_cache(maxsize=8)
def _problem(blocks: int, width: int, dtype: torch.dtype, seed: int, microbatches: int,
             rows_per_microbatch: int) -> tuple:
    """The model, X, the target and the one-process references (the run's dtype and float64) of
    one problem. They do not depend on the schedule, the chunking or recompute, so an explorer
    moved back to a problem it checked before compares against the same references without
    building them again (read only: the ranks get copies, ``pipeline_step`` copies in-process)."""
    model = make_pipeline_model(blocks, width, dtype, seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        x = torch.randn(rows_per_microbatch * microbatches, width, dtype=dtype)
        target = torch.randn(rows_per_microbatch * microbatches, width, dtype=dtype)
    ref = reference_step(model, x, target)
    ref64 = reference_step(copy.deepcopy(model).double(), x.double(), target.double())
    return model, x, target, ref, ref64


def check_pipeline(schedule: str = "1f1b", stages: int = 4, microbatches: int = 8,
                   chunks: int | None = None, dtype=torch.float32, seed: int = 0, bug: str | None = None,
                   recompute: bool = False, op_time=None, width: int = 8,
                   rows_per_microbatch: int = 2, timeout: float = 60.0) -> Report:
    """``pipeline_step`` on ``stages`` ranks against one process on the whole batch.

    ``chunks`` defaults to ``INTERLEAVED_CHUNKS`` (2) for interleaved and 1 for the others.
    Refuses (ValueError, before any rank starts) a bad size, an unknown schedule or bug, chunks
    that do not fit the schedule (interleaved needs >= 2, the others 1) and, for interleaved,
    micro-batches not divisible by the stage count.
    """
    dtype, p = as_dtype(dtype), resolve_world_size(stages)
    positive_sizes(microbatches=microbatches, width=width,
                   rows_per_microbatch=rows_per_microbatch)
    chunks = (INTERLEAVED_CHUNKS if schedule == "interleaved" else 1) if chunks is None else chunks
    # the prediction; also refuses a bad schedule, size or op_time before any rank starts
    sim = simulated_for(schedule, p, microbatches, chunks, op_time, recompute)
    model, x, target, (ref_loss, ref_grads), (ref64_loss, ref64_grads) = _problem(
        p * chunks, width, dtype, seed, microbatches, rows_per_microbatch)
    res = pipeline_step(model, x, target, F.mse_loss, schedule, p, microbatches, chunks,
                        op_time=op_time, recompute=recompute, bug=bug, timeout=timeout)
    rows = [compare("loss", p - 1, torch.tensor(res.loss, dtype=dtype), ref_loss, ref64_loss,
                    dtype)]
    for s, piece in enumerate(split_model(model, p * chunks)):
        for name, _ in piece.named_parameters():
            rows.append(compare(f"{name}.grad", s % p, res.grads.get(name), ref_grads[name],
                                ref64_grads[name], dtype))
    config = check_config(p, dtype, seed, bug, schedule=schedule, stages=p,
                          microbatches=microbatches, chunks=chunks, recompute=recompute,
                          op_time=None if op_time is None else list(op_time))
    measured = res.measured()
    extra = {"pipeline": {
        "ops_match_schedule": all(res.ops(r) == list(res.schedule[r]) for r in range(p)),
        "peak_stashed": res.peak_stashed, "simulated_peak_activations": sim.peak_activations,
        "stash_bytes": res.stash_bytes, "recompute_bytes": res.recompute_bytes,
        "measured_bubble_fraction": measured.bubble_fraction,
        "simulated_bubble_fraction": sim.bubble_fraction, "makespan_s": measured.makespan,
        "timeline": [vars(e) for e in res.timeline]}}
    report = Report("pipeline", config, rows, [], res.records, extra=extra)
    report.result = res   # the full PipelineResult, for figures (not part of to_dict)
    return report
