"""``check_plan``: the planner's formulas against bytes measured on real ranks, for the tiny model.

    report = check_plan(tp=2, pp=2, dp=2, strategy="zero1")
    report.passed, report.rows, report.extra["held"], report.extra["activations"]

Two measurements, each compared exactly (bytes are integers; tolerance 0):

* **model states** (rows ``parameters``, ``gradients``, ``optimizer states``, one per rank): the
  capstone's tiny GPT cut into this rank's stage with the capstone's own layers
  (``capstone.layers.build_stage``) and its data-parallel strategy (``ddp`` or ``zero1``, the
  course's ``dp`` classes) over the ``dp x cp`` group, after one optimizer step; the bytes come
  from the strategy's ``held()`` (distinct storages: a view counts once). Gradients are set to zero
  before the step: what is held does not depend on their values. One dtype, no mixed precision:
  parameters and gradients ``d`` bytes, Adam's two moments ``2d``.
* **activations** (rows ``activations TP`` and ``activations SP``, rank 0): the SP notebook's
  measurement (``sp.memory.measure_activation_memory``: bytes autograd saves in the MLP block)
  against the planner's MLP terms (``ln2 input + fc1 input + mlp hidden + mlp dropout mask``) for
  tensor parallelism alone and with sequence parallelism (Megatron's re-gathered fc1 input).

Refuses (ValueError, before any rank starts) sizes the capstone refuses, an unknown strategy or bug.
"""
from __future__ import annotations

import torch

from mtb_helpers.capstone.grid import Grid, GridLayout
from mtb_helpers.capstone.layers import build_stage
from mtb_helpers.capstone.model import GPTConfig, make_model
from mtb_helpers.capstone.reference import TrainConfig
from mtb_helpers.capstone.validate import validate
from mtb_helpers.checking.bug import resolve, swap
from mtb_helpers.checking.report import Report, Row, exact
from mtb_helpers.checking.tolerances import as_dtype
from mtb_helpers.dp.fsdp import build_strategy
from mtb_helpers.dp.strategies import flat
from mtb_helpers.plan.budget import OPTIMIZER_BYTES, stage_params
from mtb_helpers.plan.memory import MLP_TERMS, STATE_TERMS, MemoryModel
from mtb_helpers.plan.presets import tiny_gpt
from mtb_helpers.plan.specs import Layout
from mtb_helpers.runtime.ranks import run
from mtb_helpers.sp.memory import measure_activation_memory

__all__ = ["check_plan", "held_on_rank", "STRATEGIES"]

STRATEGIES = {"ddp": 0, "zero1": 1}      # the capstone's data-parallel strategies, as ZeRO stages
_DTYPES = {torch.float64: "fp64", torch.float32: "fp32"}


def held_on_rank(model, layout: GridLayout, strategy: str) -> dict:
    """Run on every rank: this rank's stage and strategy, one step on zero gradients; the bytes
    held (``{"parameters", "gradients", "optimizer states"}``) and the parameters' count."""
    grid = Grid.build(layout)
    try:
        at = grid.index
        module = build_stage(model, at["pp"], layout.pp, True, grid.tensor_group(),
                             grid.context_group())
        params = flat(module.parameters())
        start = {"params": params, "exp_avg": torch.zeros_like(params),
                 "exp_avg_sq": torch.zeros_like(params), "step": 0}
        opt = build_strategy(strategy, module, start, TrainConfig().adam(),
                             group=grid.gradient_group(), copy_model=False)
        for p in module.parameters():
            p.grad = torch.zeros_like(p)
        opt.reduce_gradients()       # the dp x cp group: all-reduce (ddp) or reduce-scatter (zero1)
        opt.step()
        held = opt.held()
        return {"index": dict(at), "count": params.numel(),
                "held": {"parameters": held["params"], "gradients": held["grads"],
                         "optimizer states": held["optimizer_state"]}}
    finally:
        grid.destroy()


def _row(quantity: str, rank: int, measured: float, predicted: float) -> Row:
    return exact(quantity, rank, measured, predicted, f"measured {int(measured)} B, planner {predicted:.0f} B")


def check_plan(tp: int = 2, pp: int = 2, dp: int = 2, cp: int = 1, strategy: str = "zero1",
               dtype=torch.float64, cfg: GPTConfig = GPTConfig(), seq_len: int = 8,
               batch: int = 2, hidden: int = 8, ffn_hidden: int = 32, dropout_p: float = 0.1,
               bug: str | None = None, timeout: float = 60.0) -> Report:
    """The planner's bytes per rank against the capstone's (model states, ``tp*pp*dp*cp`` ranks)
    and the SP block's (activations, ``tp`` ranks); see the module docstring."""
    dtype = as_dtype(dtype)
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    grid_layout = GridLayout(tp, pp, dp, cp)
    validate(grid_layout, cfg, TrainConfig(batch=max(dp, 1) * 2), 2, "1f1b", True, "ddp")
    mm = swap(resolve(bug, "plan"), MemoryModel)()
    results = run(held_on_rank, make_model(cfg, 0, dtype), grid_layout, strategy,
                  world_size=grid_layout.world_size, timeout=timeout)
    name = _DTYPES[dtype]
    layout = Layout(tp, pp, dp, cp, zero_stage=STRATEGIES[strategy], dtype=name)
    spec, d = tiny_gpt(cfg), layout.dtype_bytes
    rows, predicted_held = [], []
    for rank, res in enumerate(results):
        stage = grid_layout.mesh().coords(rank)["pp"]
        count = stage_params(spec, layout, stage, mm)["dense"]
        want = mm.model_states(count, dp * cp, layout.zero_stage, OPTIMIZER_BYTES[name], d, d,
                               pad=True)
        predicted_held.append(want)
        rows += [_row(term, rank, res["held"][term], want[term]) for term in STATE_TERMS]
    figures = measure_activation_memory((tp,), seq_len, batch, hidden, ffn_hidden, dropout_p,
                                        torch.float32, timeout=timeout)[0]
    activations = {}
    for variant, sp, label in (("tp", False, "activations TP"), ("sp_regather", True,
                                                                 "activations SP")):
        terms = mm.activation_terms(seq_len, batch, hidden, tp, tp, sp, "none",
                                    ffn_hidden=ffn_hidden, dropout=dropout_p > 0, dtype_bytes=4)
        want = sum(terms[k] for k in MLP_TERMS)
        got = figures["variants"][variant]["measured_total"]
        activations[variant] = {"measured": got, "planner": want,
                                "terms": {k: terms[k] for k in MLP_TERMS}}
        rows.append(_row(label, 0, got, want))
    config = {"tp": tp, "pp": pp, "dp": dp, "cp": cp, "strategy": strategy, "dtype": name,
              "model": cfg.to_dict(), "sp_block": {"seq_len": seq_len, "batch": batch,
                                                   "hidden": hidden, "ffn_hidden": ffn_hidden,
                                                   "dropout_p": dropout_p}, "bug": bug}
    extra = {"held": {"measured": [r["held"] for r in results], "planner": predicted_held,
                      "params": [r["count"] for r in results], "unit": "bytes per rank"},
             "activations": activations}
    return Report("plan", config, rows, extra=extra)
