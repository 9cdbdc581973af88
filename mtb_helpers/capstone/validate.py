"""Refuse a layout or size that cannot work, with one line naming the sizes, before any rank starts."""
from __future__ import annotations

import math

from mtb_helpers.capstone.grid import GridLayout
from mtb_helpers.capstone.model import GPTConfig
from mtb_helpers.capstone.reference import TrainConfig
from mtb_helpers.runtime.ranks import MAX_WORLD_SIZE

__all__ = ["validate", "admissible_layouts", "DP_STRATEGIES", "PP_SCHEDULES"]

DP_STRATEGIES = ("ddp", "zero1")   # the DP strategies the capstone composes
PP_SCHEDULES = ("1f1b", "gpipe")   # one model chunk per rank


def _positive(**values) -> None:
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")


def _finite(low: float, strict: bool, **values) -> None:
    for name, v in values.items():
        ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
              and (v > low if strict else v >= low))
        if not ok:
            raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {low}, "
                             f"got {v!r}")


def validate(layout: GridLayout, cfg: GPTConfig, run: TrainConfig, microbatches: int, schedule: str,
             sequence_parallel: bool, strategy: str, timeout: float | None = None) -> None:
    _positive(tp=layout.tp, pp=layout.pp, dp=layout.dp, cp=layout.cp, steps=run.steps,
              microbatches=microbatches, batch=run.batch)
    _finite(0, True, lr=run.lr)
    _finite(0, False, weight_decay=run.weight_decay)
    if timeout is not None:
        _finite(0, True, timeout=timeout)
    if layout.world_size > MAX_WORLD_SIZE:
        raise ValueError(f"tp*pp*dp*cp = {layout.tp}*{layout.pp}*{layout.dp}*{layout.cp} = "
                         f"{layout.world_size} ranks; this machine runs at most {MAX_WORLD_SIZE}")
    if schedule not in PP_SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(PP_SCHEDULES)}, got {schedule!r}")
    if strategy not in DP_STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(DP_STRATEGIES)}, got {strategy!r}")
    t = layout.tp
    if cfg.hidden % cfg.heads:
        raise ValueError(f"hidden={cfg.hidden} is not divisible by heads={cfg.heads}: every head "
                         f"needs the same number of features")
    for what, size in (("heads", cfg.heads), ("vocab", cfg.vocab), ("ffn", cfg.ffn)):
        if size % t:
            raise ValueError(f"{what}={size} is not divisible by tp={t}: tensor parallelism gives "
                             f"each rank {what}/tp of them")
    if cfg.layers % layout.pp:
        raise ValueError(f"layers={cfg.layers} is not divisible by pp={layout.pp}: every pipeline "
                         f"stage holds layers/pp blocks")
    if cfg.seq % layout.cp:
        raise ValueError(f"seq={cfg.seq} is not divisible by cp={layout.cp}: context parallelism "
                         f"gives each rank seq/cp positions")
    if sequence_parallel and (cfg.seq // layout.cp) % t:
        raise ValueError(f"seq/cp = {cfg.seq}/{layout.cp} = {cfg.seq // layout.cp} is not divisible "
                         f"by tp={t}: sequence parallelism splits each context chunk over tp")
    if run.batch % (layout.dp * microbatches):
        raise ValueError(f"batch={run.batch} is not divisible by dp*microbatches = {layout.dp}*"
                         f"{microbatches}: every replica cuts its B/dp sequences into micro-batches")


def admissible_layouts(world_sizes=(1, 2, 4, 8), cfg: GPTConfig = GPTConfig(), batch: int = 8,
                       microbatches: int = 2) -> list[GridLayout]:
    """Every (tp, pp, dp, cp) whose sizes divide, with world size in ``world_sizes``."""
    out = []
    for w in world_sizes:
        for tp in range(1, w + 1):
            for pp in range(1, w + 1):
                for dp in range(1, w + 1):
                    cp, rest = divmod(w, tp * pp * dp)
                    if rest or cp < 1:
                        continue
                    layout = GridLayout(tp, pp, dp, cp)
                    try:
                        validate(layout, cfg, TrainConfig(batch=batch), microbatches, "1f1b",
                                 True, "ddp")
                    except ValueError:
                        continue
                    out.append(layout)
    return out
