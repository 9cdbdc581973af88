"""Refuse a layout or size that cannot work, with one line naming the sizes, before any rank starts."""
from __future__ import annotations

import math
from itertools import product

from mtb_helpers.capstone.grid import GridLayout
from mtb_helpers.capstone.model import GPTConfig
from mtb_helpers.capstone.reference import TrainConfig
from mtb_helpers.checking.tolerances import divisible, number, positive_sizes
from mtb_helpers.runtime.ranks import MAX_WORLD_SIZE

__all__ = ["validate", "admissible_layouts", "DP_STRATEGIES", "PP_SCHEDULES"]

DP_STRATEGIES = ("ddp", "zero1")   # the DP strategies the capstone composes
PP_SCHEDULES = ("1f1b", "gpipe")   # one model chunk per rank


def validate(layout: GridLayout, cfg: GPTConfig, run: TrainConfig, microbatches: int, schedule: str,
             sequence_parallel: bool, strategy: str, timeout: float | None = None) -> None:
    positive_sizes(tp=layout.tp, pp=layout.pp, dp=layout.dp, cp=layout.cp, steps=run.steps,
                   microbatches=microbatches, batch=run.batch)
    finite = {"lr": (run.lr, True), "weight_decay": (run.weight_decay, False),
              **({} if timeout is None else {"timeout": (timeout, True)})}
    for name, (value, strict) in finite.items():
        number(name, value, lambda v: math.isfinite(v) and (v > 0 if strict else v >= 0),
               f"a finite number {'>' if strict else '>='} 0")
    if layout.world_size > MAX_WORLD_SIZE:
        raise ValueError(f"tp*pp*dp*cp = {layout.tp}*{layout.pp}*{layout.dp}*{layout.cp} = "
                         f"{layout.world_size} ranks; this machine runs at most {MAX_WORLD_SIZE}")
    if schedule not in PP_SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(PP_SCHEDULES)}, got {schedule!r}")
    if strategy not in DP_STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(DP_STRATEGIES)}, got {strategy!r}")
    t = layout.tp
    divisible("hidden", cfg.hidden, f"heads={cfg.heads}", cfg.heads,
              "every head needs the same number of features")
    for what, size in (("heads", cfg.heads), ("vocab", cfg.vocab), ("ffn", cfg.ffn)):
        divisible(what, size, f"tp={t}", t, f"tensor parallelism gives each rank {what}/tp of them")
    divisible("layers", cfg.layers, f"pp={layout.pp}", layout.pp,
              "every pipeline stage holds layers/pp blocks")
    divisible("seq", cfg.seq, f"cp={layout.cp}", layout.cp,
              "context parallelism gives each rank seq/cp positions")
    if sequence_parallel and (cfg.seq // layout.cp) % t:
        raise ValueError(f"seq/cp = {cfg.seq}/{layout.cp} = {cfg.seq // layout.cp} is not divisible "
                         f"by tp={t}: sequence parallelism splits each context chunk over tp")
    divisible("batch", run.batch, f"dp*microbatches = {layout.dp}*{microbatches}",
              layout.dp * microbatches, "every replica cuts its B/dp sequences into micro-batches")


def admissible_layouts(world_sizes=(1, 2, 4, 8), cfg: GPTConfig = GPTConfig(), batch: int = 8,
                       microbatches: int = 2) -> list[GridLayout]:
    """Every (tp, pp, dp, cp) whose sizes divide, with world size in ``world_sizes``."""
    out, sizes = [], range(1, max(world_sizes) + 1)
    for w, tp, pp, dp in product(world_sizes, sizes, sizes, sizes):
        cp, rest = divmod(w, tp * pp * dp)
        if rest or cp < 1:
            continue
        layout = GridLayout(tp, pp, dp, cp)
        try:
            validate(layout, cfg, TrainConfig(batch=batch), microbatches, "1f1b", True, "ddp")
        except ValueError:
            continue
        out.append(layout)
    return out
