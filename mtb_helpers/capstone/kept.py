"""This rank's stage of the capstone (its layers, DP strategy and SP grad sum), built once per
setting and kept in the rank process between calls; each call only puts its start state in
(``resume``, ``FlatStep.load``)."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from mtb_helpers.capstone.finalize import SequenceParallelGrads
from mtb_helpers.capstone.layers import ParallelEmbedding, build_stage, replicated_params
from mtb_helpers.checking.bug import swap
from mtb_helpers.dp.fsdp import build_strategy
from mtb_helpers.dp.strategies import FlatStep, flat

__all__ = ["Stage", "STAGES", "KEEP_STAGES", "kept_stage", "drop", "resume"]


def resume(params: torch.Tensor, state: dict | None) -> dict:
    """``start`` for the strategy: fresh, or this rank's snapshot (Adam's moments put back at
    their place in a zero ``[Ψ]``; padding entries stay zero in training too)."""
    if state is None:
        return {"params": params, "exp_avg": torch.zeros_like(params),
                "exp_avg_sq": torch.zeros_like(params), "step": 0}
    lo, hi = state["own"]
    out = {"params": state["params"].clone(), "step": state["step"]}
    for k in ("exp_avg", "exp_avg_sq"):
        full = torch.zeros(max(hi, len(params)), dtype=params.dtype)
        full[lo:hi] = state[k]
        out[k] = full[:len(params)]
    return out


@dataclass
class Stage:
    """This rank's built stage: its module, the DP strategy owning its parameters (views of its
    flat buffer), the SP grad sum, the parameters as built (flat ``[Ψ_stage]``: a fresh run's
    start), their names and shapes (``named_parameters`` order)."""
    module: torch.nn.Module
    opt: FlatStep   # the capstone composes DDP and ZeRO-1 (validate.DP_STRATEGIES), both FlatSteps
    sp_grads: SequenceParallelGrads | None
    initial: torch.Tensor
    names: tuple[str, ...] = ()
    shapes: tuple[torch.Size, ...] = ()


# In a rank process: the stages built by earlier calls, least recently used first (building one
# costs ~14 ms of an explorer's redraw at 4 ranks). The key holds the process groups themselves:
# groups made again are another key, so a stage never outlives its groups.
STAGES: OrderedDict = OrderedDict()
KEEP_STAGES = 2   # an explorer moving between two layouts keeps both (a rank's pool serves both)


def kept_stage(grid, model, model_key, layout, run_cfg, sequence_parallel, strategy, bug) -> tuple:
    """``(key, Stage)`` for this setting: the kept one, or built now."""
    tp_group = grid.tensor_group()
    key = (model_key, layout, sequence_parallel, strategy, run_cfg.adam(),
           bug, tuple(bug.replaces.items()) if bug is not None else (),
           tp_group, grid.context_group(), grid.gradient_group(), grid.rank)
    built = STAGES.pop(key, None)
    if built is None:
        module = build_stage(model, grid.index["pp"], layout.pp, sequence_parallel, tp_group,
                             grid.context_group(), swap(bug, ParallelEmbedding))
        initial = flat(module.parameters())
        opt = build_strategy(strategy, module, resume(initial, None), run_cfg.adam(),
                             group=grid.gradient_group(), copy_model=False)
        # under SP: the LayerNorm / bias grads, partial per tp rank, summed in one all-reduce a step
        sp_grads = (swap(bug, SequenceParallelGrads)(replicated_params(module), tp_group)
                    if sequence_parallel else None)
        names, params = zip(*module.named_parameters())
        built = Stage(module, opt, sp_grads, initial, names, tuple(p.shape for p in params))
    STAGES[key] = built
    while len(STAGES) > KEEP_STAGES:
        STAGES.popitem(last=False)
    return key, built


def drop(key: tuple) -> None:
    """Forget the stage of ``key`` (its call failed: it may be half-way through a step)."""
    STAGES.pop(key, None)
