"""Bytes each rank sends per training step, by process group: measured from the collective
records, and the formulas they must equal.

Groups: ``tp`` (the f / g all-reduces, the embedding's g, the vocabulary cross-entropy's three
all-reduces), ``sp`` (sequence parallelism's all-gathers / reduce-scatters and, once per step, the
one all-reduce of its LayerNorm and bias grads, ``finalize.py``; they run in the tensor group
too), ``pp`` (point-to-point activations and input grads), ``cp`` (ring attention's K/V hops),
``dp`` (the gradient reduction of the DP strategy over the dp x cp group). Ring costs as the
records count them: all-reduce ``2(g-1)/g N``, all-gather and reduce-scatter ``(g-1)/g N`` of the
full tensor, ``N`` bytes sent per hop.

Notation for one micro-batch on one rank: ``n = s/c`` positions of its context chunk,
``b = B/(dp m)`` sequences, ``A = n b h d`` bytes of a full-width activation, ``t`` = tp, ``c`` = cp,
``g = dp c``, ``L_p`` blocks on the stage, ``Ψ_r`` parameters on the rank, ``Ψ_rep = (6 L_p + 2
(last stage)) h`` of them replicated under SP (each block's two LayerNorms' weight and bias, Wo's
and fc2's biases; the final LayerNorm).
"""
from __future__ import annotations

from mtb_helpers.capstone.grid import GridLayout
from mtb_helpers.capstone.layers import stage_blocks
from mtb_helpers.capstone.model import GPTConfig
from mtb_helpers.cp.reference import expected_bytes
from mtb_helpers.comm.regions import GATHER_SP, GRAD_ALLREDUCE_SP, REDUCE_SCATTER_SP, SCATTER_SP
from mtb_helpers.dp.strategies import padded_numel

__all__ = ["GROUP_NAMES", "group_of", "measured_bytes", "formula_bytes", "FORMULAS"]

GROUP_NAMES = ("tp", "sp", "pp", "cp", "dp")
_DP_REGIONS = ("ddp_grad_bucket", "zero_grad_reduce_scatter", "zero_param_all_gather")
_SP_REGIONS = (SCATTER_SP, GATHER_SP, REDUCE_SCATTER_SP, GRAD_ALLREDUCE_SP)

FORMULAS = {
    "tp": "per micro-batch: blocks 8(t-1)/t·n_act each without SP; embedding g 2(t-1)/t·n_act; "
          "head f 2(t-1)/t·n_act without SP; cross-entropy 3·2(t-1)/t·n_act/h",
    "sp": "per micro-batch: blocks 8(t-1)/t·n_act each; embedding split (t-1)/t·n_act; "
          "head 2(t-1)/t·n_act; once per step: LayerNorm and bias grads 2(t-1)/t·Ψ_rep·e, "
          "one all-reduce",
    "pp": "per micro-batch: n_act/t (n_act without SP) to the next stage, n_act/t back to the "
          "previous one",
    "cp": "per micro-batch and block, n_kv = n_act/t bytes of this rank's K (or V): forward "
          "2(cp-1)·n_kv, backward 4(cp-1)·n_kv + 2·n_kv (K, V, dK, dV around the ring, dK and dV home)",
    "dp": "2(p-1)/p·Ψ_r·e with p = dp·cp (DDP all-reduce; ZeRO-1 reduce-scatter + all-gather of "
          "Ψ_r padded)",
}


def group_of(event) -> str:
    """Which group an event of the record ran in (by the region that issued it)."""
    if event.region in _DP_REGIONS:
        return "dp"
    if event.region.startswith("cp."):
        return "cp"
    if event.op in ("send", "recv"):
        return "pp"
    if event.region in _SP_REGIONS:
        return "sp"
    return "tp"


def measured_bytes(rec) -> dict[str, int]:
    """``{group: bytes sent}`` from one rank's record of one step."""
    out = dict.fromkeys(GROUP_NAMES, 0)
    for e in rec.events:
        out[group_of(e)] += e.sent_bytes
    return out


def formula_bytes(layout: GridLayout, cfg: GPTConfig, batch: int, microbatches: int,
                  sequence_parallel: bool, strategy: str, index: dict, numel: int,
                  dtype_bytes: int) -> dict[str, int]:
    """``{group: bytes}`` the rank at ``index`` must send in one step (see the module docstring)."""
    t, c, g, m = layout.tp, layout.cp, layout.dp * layout.cp, microbatches
    d, h = dtype_bytes, cfg.hidden
    n, b = cfg.seq // c, batch // (layout.dp * m)
    a = n * b * h * d
    blocks = len(stage_blocks(cfg.layers, layout.pp, index["pp"]))
    first, last = index["pp"] == 0, index["pp"] == layout.pp - 1
    ring = lambda nbytes: 2 * (t - 1) * nbytes // t   # noqa: E731  (all-reduce)
    half = lambda nbytes: (t - 1) * nbytes // t       # noqa: E731  (all-gather / reduce-scatter)
    tp = sp = 0
    finalize = 0   # once per step, not per micro-batch
    if sequence_parallel:
        sp += blocks * 8 * half(a) + (half(a) if first else 0) + (2 * half(a) if last else 0)
        finalize = ring((6 * blocks + (2 if last else 0)) * h * d)
    else:
        tp += blocks * 4 * ring(a) + (ring(a) if last else 0)
    tp += (ring(a) if first else 0) + (3 * ring(n * b * d) if last else 0)
    boundary = (a // t if sequence_parallel else a)
    pp = boundary * ((0 if last else 1) + (0 if first else 1))
    cp = blocks * sum(expected_bytes("ring", a // t, c).values())   # K/V of its a/t heads
    psi = numel if strategy == "ddp" else padded_numel(numel, g)
    dp = 2 * (g - 1) * psi * d // g
    return {"tp": m * tp, "sp": m * sp + finalize, "pp": m * pp, "cp": m * cp, "dp": dp}
