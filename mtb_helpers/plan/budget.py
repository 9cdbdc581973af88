"""What one rank holds under a layout: its parameters, their model states, its activations.

    stages = memory_per_rank(model, layout)       # one StageMemory per pipeline stage
    stages[0].terms    {"parameters": bytes, ..., "activations": bytes, ...}
    stages[0].total    bytes on each rank of stage 0 (every tp/cp/dp rank of a stage is alike)

A pipeline stage of ``L_r`` layers on a tensor-parallel rank holds each layer's weights as
``MemoryModel.layer_params`` splits them (experts over ``ep``, then ``tp``). The first stage holds
the input embedding (and learned positions), the last the final norm and the output layer (a copy
of the tied embedding when ``pp > 1``, as Megatron-LM keeps one), their vocabulary rows split by ``tp``.

Activations: ``MemoryModel.activation_terms`` per layer and micro-batch on a sequence of
``seq_len / cp``, with the layout's attention kernel (FlashAttention unless ``Layout.attention``
says "materialized"), times the layers of the stage, times the micro-batches the schedule keeps in
flight on that stage (``mtb_helpers.pp.simulate``'s ``peak_memory``: p - r for 1F1B's stage r, m
for GPipe, more for interleaved on the first stages). The last stage also keeps the final norm's
and the output layer's inputs and the fp32 logits ``4 s b V/t`` (Korthikanti et al. sec. 4.3),
the first stage the embedding's dropout mask. Full recompute rebuilds one layer's activations
during its backward: that layer's full set is added once ("recompute working set"). ZeRO-3
gathers a layer's parameters before use and prefetches the next: two layers' 16-bit weights.
Not counted: the CUDA context, NCCL's buffers, the allocator's fragmentation (a few GB on a real
GPU; the planner's ``reserve`` leaves room for them).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from mtb_helpers.plan.memory import STATE_TERMS, MemoryModel
from mtb_helpers.plan.specs import NORMS, Layout, ModelSpec, stage_layers
from mtb_helpers.pp.schedules import schedule as make_schedule
from mtb_helpers.pp.simulator import simulate

__all__ = ["StageMemory", "layer_params", "stage_params", "total_params", "memory_per_rank",
           "inflight", "extrapolated", "vocab_rows", "OPTIMIZER_BYTES", "MEMORY_TERMS"]

# Optimizer bytes per parameter with Adam: mixed precision keeps fp32 master weights, momentum and
# variance (K = 12, the ZeRO paper); one-dtype training keeps momentum and variance only.
OPTIMIZER_BYTES = {"bf16": 12, "fp16": 12, "fp32": 8, "fp64": 16}
MEMORY_TERMS = ("parameters", "gradients", "optimizer states", "ZeRO-3 gathered layers",
                "activations", "recompute working set", "embedding and output activations")


@dataclass
class StageMemory:
    """Bytes on each rank of one pipeline stage, by term, and the parameter counts behind them."""
    stage: int
    layers: int
    params: dict[str, float]          # {"dense": per-rank count, "experts": per-rank count}
    inflight: float                   # micro-batches (whole stages) of activations held at peak
    terms: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.terms.values())


def layer_params(model: ModelSpec, tp: int = 1, ep: int = 1) -> dict[str, float]:
    """Parameters of one layer on one rank (``MemoryModel.layer_params``)."""
    return MemoryModel().layer_params(model, tp, ep)


def vocab_rows(model: ModelSpec, tp: int) -> int:
    """Rows of the embedding and output layer on one tensor-parallel rank."""
    return -(-model.vocab // tp)               # Megatron pads the vocabulary to split it evenly


def stage_params(model: ModelSpec, layout: Layout, stage: int,
                 memory_model: MemoryModel | None = None) -> dict[str, float]:
    """Parameters on one rank of pipeline ``stage`` (rank ``stage`` when interleaved: it holds
    virtual stages stage, stage + pp, ...)."""
    n = rank_layers(model, layout)[stage]
    per = (memory_model or MemoryModel()).layer_params(model, layout.tp, layout.ep)
    out = {"dense": n * per["dense"], "experts": n * per["experts"]}
    h, rows = model.hidden, vocab_rows(model, layout.tp)
    if stage == 0:
        out["dense"] += rows * h + (model.seq_len * h if model.learned_positions else 0)
    if stage == layout.pp - 1:
        out["dense"] += NORMS[model.norm] * h
        if not (model.tied_embeddings and layout.pp == 1):
            out["dense"] += rows * h
    return out


def total_params(model: ModelSpec) -> float:
    """Every parameter of the model once (tied embeddings once)."""
    p = stage_params(model, Layout(), 0)
    return p["dense"] + p["experts"]


def rank_layers(model: ModelSpec, layout: Layout) -> list[int]:
    """Layers on each pipeline rank (the sum over its chunks when interleaved)."""
    per_virtual = stage_layers(model.layers, layout.pp * layout.chunks)
    if per_virtual is None:
        raise ValueError(f"layers={model.layers} do not split over pp*chunks = "
                         f"{layout.pp}*{layout.chunks} stages")
    return [sum(per_virtual[c * layout.pp + r] for c in range(layout.chunks))
            for r in range(layout.pp)]


@lru_cache(maxsize=256)
def _ops(name: str, pp: int, m: int, chunks: int):
    return make_schedule(name, pp, m, chunks if name == "interleaved" else None)


def extrapolated(measure, name: str, pp: int, m: int, chunks: int = 1):
    """``measure(schedule ops)`` (a number or a tuple of numbers) for ``m`` micro-batches. Beyond
    ``3 pp`` the schedules are periodic (each further group of ``pp`` micro-batches adds the same
    amount everywhere: 1F1B's steady state, GPipe's longer fill), so the simulator runs at
    ``m1 = 2 pp + m mod pp`` and ``m1 + pp`` and the line through them is extended (tests compare
    it with a direct run): a 16-stage, 512-micro-batch pipeline costs a 50-micro-batch one."""
    m1 = 2 * pp + m % pp
    if m <= m1 + pp:
        return measure(_ops(name, pp, m, chunks))
    lo, hi = measure(_ops(name, pp, m1, chunks)), measure(_ops(name, pp, m1 + pp, chunks))
    scale = (m - m1) / pp
    if isinstance(lo, tuple):
        return tuple(a + (b - a) * scale for a, b in zip(lo, hi))
    return lo + (hi - lo) * scale


def _peaks(ops) -> tuple[float, ...]:
    return tuple(simulate(ops).peak_memory)


@lru_cache(maxsize=512)
def inflight(name: str, pp: int, microbatches: int, chunks: int = 1) -> tuple[float, ...]:
    """Per pipeline rank: whole-stage micro-batches of activations held at the peak, from the
    course's simulator (``Timeline.peak_memory``)."""
    return extrapolated(_peaks, name, pp, microbatches, chunks)


def memory_per_rank(model: ModelSpec, layout: Layout) -> list[StageMemory]:
    """One ``StageMemory`` per pipeline stage (see the module docstring for every term)."""
    mm = MemoryModel()

    def one_layer(recompute: str) -> float:
        return sum(mm.activation_terms(
            model.seq_len // layout.cp, layout.microbatch, model.hidden, model.heads, layout.tp,
            layout.sequence_parallel, recompute, kv_heads=model.kv_heads, ffn_hidden=model.ffn_hidden,
            gated_mlp=model.gated_mlp, dropout=model.dropout, top_k=model.top_k,
            dtype_bytes=layout.dtype_bytes, attention=layout.attention,
            fused_swiglu=model.fused_swiglu).values())
    per_layer = one_layer(layout.recompute)
    working = one_layer("none") if layout.recompute == "full" else 0.0
    held = inflight(layout.schedule, layout.pp, layout.grad_accum, layout.chunks)
    layers = rank_layers(model, layout)
    d = layout.dtype_bytes
    k = OPTIMIZER_BYTES[layout.dtype]
    n_dense = layout.dp * layout.cp                        # who shares a dense parameter's shard
    n_expert = n_dense // layout.ep
    s, b, rep = model.seq_len // layout.cp, layout.microbatch, (
        layout.tp if layout.sequence_parallel else 1)
    per = mm.layer_params(model, layout.tp, layout.ep)
    out = []
    for r in range(layout.pp):
        params = stage_params(model, layout, r, mm)
        terms = dict.fromkeys(STATE_TERMS, 0.0)
        for kind, n in (("dense", n_dense), ("experts", n_expert)):
            if params[kind]:
                for t, v in mm.model_states(params[kind], n, layout.zero_stage, k, d, d,
                                            pad=True).items():
                    terms[t] += v
        terms["ZeRO-3 gathered layers"] = (2 * d * (per["dense"] + per["experts"])
                                           if layout.zero_stage == 3 else 0.0)
        terms["activations"] = held[r] * layers[r] * per_layer
        terms["recompute working set"] = working
        ends = 0.0
        if r == 0 and model.dropout:
            ends += s * b * model.hidden / rep               # embedding dropout mask
        if r == layout.pp - 1:                               # final norm + output layer inputs,
            ends += 2 * d * s * b * model.hidden / rep + 4 * s * b * vocab_rows(model, layout.tp)
        terms["embedding and output activations"] = held[r] * ends
        out.append(StageMemory(r, layers[r], params, held[r], terms))
    return out
