"""Deliberately wrong planner formulas, for ``check_plan(bug=...)``.

Each is a ``MemoryModel`` with one method overridden (marked ``# BUG``): the slips a student makes
when counting memory by hand. ``check_plan`` compares the planner with bytes measured on real
ranks, so each of these must turn some of its rows red.
"""
from __future__ import annotations

from mtb_helpers.checking.bug import Bug, register
from mtb_helpers.plan.memory import MemoryModel

__all__ = ["BUGS", "ZeRO1ShardsGradients", "NormsSplitByTensorParallel",
           "LayerNormInputNotSequenceSplit"]


class ZeRO1ShardsGradients(MemoryModel):
    """plan-zero1-shards-gradients."""

    def model_states(self, num_params, dp, zero_stage, *args, **kwargs):
        # BUG: ZeRO-1 counted like ZeRO-2, as if the full gradient were freed after the reduce
        return super().model_states(num_params, dp, 2 if zero_stage == 1 else zero_stage,
                                    *args, **kwargs)


class NormsSplitByTensorParallel(MemoryModel):
    """plan-norms-split-by-tp."""

    def layer_params(self, model, tp=1, ep=1):
        out = super().layer_params(model, tp, ep)
        norms = 2 * (2 if model.norm == "layernorm" else 1) * model.hidden
        out["dense"] -= norms - norms / tp     # BUG: norms are whole on every tensor rank
        return out


class LayerNormInputNotSequenceSplit(MemoryModel):
    """plan-sp-layernorm-input-whole."""

    def activation_terms(self, seq, batch, hidden, heads, tp=1, sequence_parallel=False,
                         recompute="none", **details):
        out = super().activation_terms(seq, batch, hidden, heads, tp, sequence_parallel,
                                       recompute, **details)
        if sequence_parallel and "ln2 input" in out:
            out["ln2 input"] *= tp             # BUG: under SP each rank keeps only s/t rows
        return out


BUGS: dict[str, Bug] = {
    "plan-zero1-shards-gradients": Bug(
        "planner: ZeRO-1 is counted like ZeRO-2 (gradients divided by the data-parallel ranks), "
        "but ZeRO-1 keeps the full gradient buffer", ("plan",), {MemoryModel: ZeRO1ShardsGradients}),
    "plan-norms-split-by-tp": Bug(
        "planner: LayerNorm weights and biases are divided by tp, but every tensor-parallel rank "
        "holds them whole (wrong whenever tp > 1)", ("plan",),
        {MemoryModel: NormsSplitByTensorParallel}),
    "plan-sp-layernorm-input-whole": Bug(
        "planner: under sequence parallelism the LayerNorm input is counted whole [s, b, h] "
        "instead of the rank's rows [s/t, b, h] (wrong whenever tp > 1)", ("plan",),
        {MemoryModel: LayerNormInputNotSequenceSplit}),
}

register("plan", BUGS)   # at import: see checking/bug.py
