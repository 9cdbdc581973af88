"""Step times of the hiding-communication wrappers, measured on real ranks under an emulated link
with padded compute, next to the α-β prediction of ``overlap_model`` (notebook 14).

    res = measure_ddp(world_size=2, link=Link(1e-3, 0.25e9), bucket_cap_mb=0.5, overlap=True)
    res["measured"], res["predicted"], res["events"]      # seconds of the link's model

The model is ``layers`` ``PaddedLinear(h, h)`` in a row: each one's forward takes ``t_fwd`` and its
backward ``t_bwd`` of modelled time (``cost.padded``: a fixed-duration kernel, so timelines follow
the model, not this machine's two cores), and the optimizer takes ``t_opt`` for the whole model,
in proportion to the elements it updates (ZeRO-1's rank updates only its partition). Every
collective takes the link's time (``run(..., link=, time_scale=)``). A step is timed from a
barrier to the optimizer's end (DDP, ZeRO-1) or to ``finish_gradient_synchronization`` (FSDP);
``measured`` is the median over ``steps`` steps after one warm-up step, divided by the time scale.
``events`` are the last step's events (the link's timeline, in model seconds) per rank.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

from mtb_helpers.checking.tolerances import number
from mtb_helpers.cost import Link, pad_backward, padded
from mtb_helpers.dp.buckets import assign_buckets, bucket_cap_bytes
from mtb_helpers.dp.fsdp_wrapper import FSDP
from mtb_helpers.dp.overlap import OverlappedDDP
from mtb_helpers.dp.overlap_model import predict_ddp, predict_fsdp
from mtb_helpers.dp.sharded_optimizer import ShardedOptimizer, partition_by_size
from mtb_helpers.runtime.ranks import run

__all__ = ["PaddedLinear", "PaddedSGD", "NoOverlapDDP", "padded_model", "measure_ddp",
           "measure_fsdp", "step_table", "bucket_curve", "DEFAULTS", "DEFAULT_LINK"]

# A slow network (1 ms per message, 250 MB/s: about a 2 Gbit/s Ethernet) and a small model, in
# the link's seconds: a layer's 257 KiB of gradients take 2α + n/β ≈ 3 ms to all-reduce on 2
# ranks, a little more than its 2 ms backward, so overlap can hide most of it; one bucket per
# parameter pays α 16 times over, and one bucket for everything hides nothing.
DEFAULTS = {"layers": 8, "hidden": 256, "t_fwd": 0.5e-3, "t_bwd": 2e-3, "t_opt": 1e-3,
            "time_scale": 20.0}
DEFAULT_LINK = Link(1e-3, 0.25e9)


class PaddedLinear(nn.Linear):
    """``nn.Linear`` whose forward takes ``t_fwd`` and backward ``t_bwd`` modelled seconds."""

    def __init__(self, n_in: int, n_out: int, t_fwd: float, t_bwd: float, label: str) -> None:
        super().__init__(n_in, n_out)
        self.t_fwd, self.t_bwd, self.label = t_fwd, t_bwd, label

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with padded(f"{self.label} fwd", self.t_fwd):
            y = super().forward(x)                                   # [B, h] -> [B, h]
        return pad_backward(y, f"{self.label} bwd", self.t_bwd)


class PaddedSGD(torch.optim.SGD):
    """SGD with momentum whose step takes ``seconds_per_element`` for each element it updates
    (SGD, not AdamW: its real cost stays under the padding even on a busy machine)."""

    def __init__(self, params, seconds_per_element: float = 0.0, **kwargs) -> None:
        super().__init__(params, **{"momentum": 0.9, **kwargs})
        self.seconds_per_element = seconds_per_element

    def step(self, closure=None):
        n = sum(p.numel() for g in self.param_groups for p in g["params"])
        with padded("optimizer", n * self.seconds_per_element):
            return super().step(closure)


class NoOverlapDDP(OverlappedDDP):
    """The same buckets, all reduced after the backward (notebook 06's DDP): nothing hidden."""

    def _bucket_ready(self, i: int) -> bool:
        return False            # finish_gradient_synchronization starts every bucket


def padded_model(layers: int, hidden: int, t_fwd: float, t_bwd: float, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(*(PaddedLinear(hidden, hidden, t_fwd, t_bwd, f"layer {i}")
                           for i in range(layers)))


def _last_step(timeline, scale: float) -> list[list[tuple]]:
    """Per rank, the events after the last barrier (the measured step), in model seconds."""
    out = []
    for evs in timeline.ranks:
        bars = [e for e in evs if e.name == "barrier"]
        t0 = bars[-1].end if bars else 0.0
        out.append([(e.kind, e.name, (e.start - t0) / scale, (e.end - t0) / scale, e.bytes)
                    for e in evs if e.start >= t0 and e.name != "barrier"])
    return out


def _ddp_on_rank(spec: dict, cap: float, overlap: bool, zero1: bool, steps: int) -> list[float]:
    model = padded_model(spec["layers"], spec["hidden"], spec["t_fwd"], spec["t_bwd"])
    ddp = (OverlappedDDP if overlap else NoOverlapDDP)(model, bucket_cap_mb=cap)
    total = sum(p.numel() for p in model.parameters())
    per = spec["t_opt"] / total
    opt = (ShardedOptimizer(ddp.parameters(), PaddedSGD, lr=1e-3, seconds_per_element=per)
           if zero1 else PaddedSGD(ddp.parameters(), lr=1e-3, seconds_per_element=per))
    x = torch.randn(4, spec["hidden"])
    times = []
    for _ in range(steps + 1):
        opt.zero_grad(set_to_none=True)
        dist.barrier()
        t0 = time.perf_counter()
        ddp(x).square().mean().backward()
        ddp.finish_gradient_synchronization()
        opt.step()
        times.append(time.perf_counter() - t0)
    return times[1:]


def _fsdp_on_rank(spec: dict, prefetch: bool, steps: int) -> list[float]:
    model = padded_model(spec["layers"], spec["hidden"], spec["t_fwd"], spec["t_bwd"])
    fsdp = FSDP(model, prefetch=prefetch)
    x = torch.randn(4, spec["hidden"])
    times = []
    for _ in range(steps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        fsdp(x).square().mean().backward()
        fsdp.finish_gradient_synchronization()
        times.append(time.perf_counter() - t0)
    return times[1:]


def _spec(kwargs: dict) -> dict:
    spec = {**DEFAULTS, **kwargs}
    for k, v in spec.items():
        number(k, v, lambda x: x > 0, "a positive number")   # NaN > 0 is False: refused too
    return spec


def _result(results, scale, prediction) -> dict:
    per_rank = [statistics.median(r) / scale for r in results]
    return {"measured": max(per_rank), "per_rank": per_rank, "predicted": prediction.step,
            "prediction": prediction, "events": _last_step(results.timeline, scale),
            "label": results.timeline.label()}


def measure_ddp(world_size: int = 2, link: Link = DEFAULT_LINK, bucket_cap_mb: float = 25.0,
                overlap: bool = True, zero1: bool = False, steps: int = 3,
                timeout: float = 120.0, **sizes) -> dict:
    """One DDP (``zero1``: + ShardedOptimizer) configuration: measured and predicted step time."""
    spec = _spec(sizes)
    h, L, scale = int(spec["hidden"]), int(spec["layers"]), spec["time_scale"]
    layer_bytes = [[h * h * 4, h * 4]] * L
    owner = partition_by_size([n // 4 for layer in layer_bytes for n in layer], world_size)
    flat = [n for layer in layer_bytes for n in layer]
    largest = max(sum(n for n, o in zip(flat, owner) if o == r) for r in range(world_size))
    # the whole model's t_opt: predict_ddp takes the largest partition's share itself
    prediction = predict_ddp(layer_bytes, spec["t_fwd"], spec["t_bwd"], link, world_size,
                             bucket_cap_mb, overlap, spec["t_opt"], zero1, largest)
    results = run(_ddp_on_rank, {**spec, "layers": L, "hidden": h}, bucket_cap_mb, overlap, zero1,
                  steps, world_size=world_size, link=link, time_scale=scale, timeout=timeout)
    return {**_result(results, scale, prediction), "bucket_cap_mb": bucket_cap_mb,
            "overlap": overlap, "zero1": zero1}


def measure_fsdp(world_size: int = 2, link: Link = DEFAULT_LINK, prefetch: bool = True,
                 steps: int = 3, timeout: float = 120.0, **sizes) -> dict:
    """FSDP's forward + backward with or without prefetch: measured and predicted."""
    spec = _spec(sizes)
    h, L, scale = int(spec["hidden"]), int(spec["layers"]), spec["time_scale"]
    unit = -(-(h * h + h) // world_size) * world_size * 4          # a unit's padded flat bytes
    prediction = predict_fsdp([unit] * L, spec["t_fwd"], spec["t_bwd"], link, world_size, prefetch)
    results = run(_fsdp_on_rank, {**spec, "layers": L, "hidden": h}, prefetch, steps,
                  world_size=world_size, link=link, time_scale=scale, timeout=timeout)
    return {**_result(results, scale, prediction), "prefetch": prefetch}


def step_table(world_size: int = 2, link: Link = DEFAULT_LINK, bucket_cap_mb: float = 0.5,
               steps: int = 3, **sizes) -> list[dict]:
    """The five configurations of notebook 14, each measured and predicted: DDP without and with
    overlap, ZeRO-1 (overlap + ShardedOptimizer), FSDP without and with prefetch."""
    runs = [("DDP, no overlap", measure_ddp, {"overlap": False, "bucket_cap_mb": bucket_cap_mb}),
            ("DDP, overlap", measure_ddp, {"overlap": True, "bucket_cap_mb": bucket_cap_mb}),
            ("ZeRO-1", measure_ddp, {"zero1": True, "bucket_cap_mb": bucket_cap_mb}),
            ("FSDP, no prefetch", measure_fsdp, {"prefetch": False}),
            ("FSDP, prefetch", measure_fsdp, {"prefetch": True})]
    return [{"name": name, **fn(world_size, link, steps=steps, **kw, **sizes)}
            for name, fn, kw in runs]


def bucket_curve(caps, world_size: int = 2, link: Link = DEFAULT_LINK, measure: bool = True,
                 steps: int = 3, **sizes) -> dict:
    """Step time against ``bucket_cap_mb``: predicted for every cap, measured too if ``measure``;
    and the predicted step without overlap."""
    spec = _spec(sizes)
    layer_bytes = [[int(spec["hidden"]) ** 2 * 4, int(spec["hidden"]) * 4]] * int(spec["layers"])
    pred = lambda cap, ov: predict_ddp(layer_bytes, spec["t_fwd"], spec["t_bwd"], link, world_size,
                                       cap, ov, spec["t_opt"]).step
    params = list(enumerate(n for layer in layer_bytes for n in layer))
    return {"caps": list(caps), "predicted": [pred(c, True) for c in caps],
            "buckets": [len(assign_buckets(params, bucket_cap_bytes(c))) for c in caps],
            "measured": ([measure_ddp(world_size, link, c, steps=steps, **sizes)["measured"]
                          for c in caps] if measure else None),
            "no_overlap": pred(max(caps), False)}
