"""Step time of a layout, predicted: compute from the GPU's measured speed (``layer_seconds``: how
fast one tensor-parallel rank runs its share of a layer, ``compute.py``) or from FLOPs at a matmul
efficiency you choose, each dimension's communication from the α-β model
(``mtb_helpers.cost.predict``) on the link its group spans, the pipeline's bubble from the course's
simulator, and what overlap hides.

Compute from the GPU (``efficiency=None``, the default; the cluster needs a ``compute`` curve,
as ``cluster("h200")`` and ``cluster("h100")`` have): each layer's forward and backward from
``layer_breakdown`` on this rank's shard (sequence parallelism shrinks its norms), one more forward
under full recompute, selective recompute's attention forward only with materialized attention
(FlashAttention already recomputes its scores inside its backward), and the output layer's matmul
on the last stage. Compute from FLOPs (``efficiency`` a fraction of peak, the papers' way):

FLOPs (Narayanan et al. 2021, sec. 5.1; PaLM's appendix B counts the same): a token costs
``2N`` forward and ``4N`` backward on the ``N`` weights of the matmuls it passes (each layer's
attention and MLP, its ``top_k`` experts, and the output layer; the input embedding is a lookup),
plus attention's ``4·s·h`` per layer forward (QK^T and the weighted sum over ``s`` keys; causal
masking is not subtracted, as in both papers) and twice that backward. Full recompute adds one
forward of every layer, selective one forward of attention's score part. Model FLOPs (for MFU)
leave recompute out: ``6N + 12·L·h·s`` per token.

Communication per micro-batch (ring algorithms; ``d`` bytes per element, ``s' = s/cp``):

    tp  per layer, forward 2 all-reduces of [s', b, h] (attention and MLP; with sequence
        parallelism an all-gather + reduce-scatter each, the same ring bytes), backward 2 more,
        +2 under full recompute. On the critical path (nothing to hide them behind).
        The small ones besides (``tp_small_collectives``; Korthikanti et al. count only the
        above, and on a real model they cost α, not bytes): with sequence parallelism every
        parameter replicated over the group but fed a sequence shard has a partial gradient,
        summed over the group once per step, after the last backward, in one all-reduce of all
        of them (each LayerNorm's weight and bias, the row-parallel layers' biases: 6 [h] per GPT
        layer, 2 per Llama layer, plus the final norm's; Megatron-LM's ``finalize_model_grads``
        and the capstone's ``finalize.py``; notebook 04's layer reduces each one in backward,
        per micro-batch). The first stage's vocabulary-parallel embedding all-reduces [s', b, h]
        forward (g; under SP its split gathers back in backward); the last stage gathers the
        sequence for the LM head forward (its reduce-scatter backward), or under plain TP
        all-reduces the head's input grad (f), and the vocabulary-parallel cross-entropy
        all-reduces forward [s', b] (the logits' max), then [2, s', b] (the sum of exponentials
        and the target's logit together, as Megatron-LM's fused cross-entropy and the capstone).
    cp  per layer (cp - 1) ring hops of this rank's K and V [s', b, kv·d_head/tp] forward; backward
        (cp - 1) hops of K, V, dK, dV together and one more of dK, dV home (the course's ring,
        ``cp/ring.py``): hidden behind attention's own compute (with
        ``overlap``; the course's ring attention waits for each hop, so without it).
    ep  per MoE layer, forward 2 all-to-alls (dispatch, combine) of [s'·b·top_k, h], backward 2.
    pp  one send/recv of [s'/(tp if SP), b, h] per micro-batch and stage boundary, each way: the
        simulator's ``latency``.
    dp  once per step over the dp x cp ranks holding the same shard: ZeRO-0 all-reduce of the
        gradients; ZeRO-1/2 reduce-scatter of the gradients + all-gather of the parameters (the
        same ring bytes); ZeRO-3 per micro-batch two all-gathers of the parameters and one
        reduce-scatter of the gradients. With ``overlap`` the gradient reduction hides behind the
        last micro-batch's backward, the parameter gather behind the first forward (Megatron-LM's
        overlap_grad_reduce / overlap_param_gather), ZeRO-3's behind each micro-batch's compute.

A group whose ranks all sit in one node (ranks are numbered tp fastest, then cp, dp, pp, as in
the capstone) uses ``cluster.intra_node``, any other ``cluster.inter_node``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from mtb_helpers.cost import predict
from mtb_helpers.cost.model import positive
from mtb_helpers.plan.budget import extrapolated, layer_params, rank_layers, stage_params, vocab_rows
from mtb_helpers.plan.compute import layer_breakdown
from mtb_helpers.plan.specs import NORMS, ClusterSpec, Layout, ModelSpec, linears
from mtb_helpers.pp.simulator import simulate

__all__ = ["StepTime", "step_time", "stage_compute", "stage_seconds", "model_flops_per_token",
           "matmul_params", "group_link", "tp_small_collectives"]


@dataclass
class StepTime:
    """Seconds of one training step on the busiest rank, and where they go."""
    step: float
    terms: dict[str, float] = field(default_factory=dict)     # exposed seconds by cause
    hidden: dict[str, float] = field(default_factory=dict)    # seconds overlap hid
    tokens_per_second: float = 0.0
    mfu: float = 0.0
    bubble_fraction: float = 0.0


def matmul_params(model: ModelSpec, active: bool = True) -> float:
    """Weights a token multiplies by in one layer (its ``top_k`` experts when ``active``, every
    expert otherwise): ``specs.linears`` without tensor parallelism."""
    copies = model.top_k if active else model.experts
    return sum(n_in * n_out * (copies if mlp else 1) for n_in, n_out, mlp in linears(model, 1))


def model_flops_per_token(model: ModelSpec, seq_len: int | None = None) -> float:
    """``6N + 12·L·h·s``: training FLOPs of one token without recompute (N: matmul weights a
    token uses, output layer included)."""
    s = seq_len or model.seq_len
    n = model.layers * matmul_params(model) + model.vocab * model.hidden
    return 6 * n + 12 * model.layers * model.hidden * s


def group_link(cluster: ClusterSpec, span: int):
    """The link of a group whose ranks lie within ``span`` consecutive ranks."""
    return cluster.intra_node if span <= cluster.gpus_per_node else cluster.inter_node


def _time(collective: str, nbytes: float, ranks: int, link) -> float:
    return 0.0 if ranks == 1 or nbytes == 0 else predict(collective, nbytes, ranks, link)


@lru_cache(maxsize=4096)
def _pipeline(name: str, pp: int, m: int, chunks: int, ratio: float, lat: float):
    """(makespan, bubble fraction) for forward 1, backward ``ratio``, latency ``lat`` (cached:
    plan() asks the same shapes many times; times are rounded by the caller)."""
    def measure(ops):
        timeline = simulate(ops, forward=1.0, backward=ratio, latency=lat)
        return timeline.makespan, sum(timeline.busy)
    span, busy = extrapolated(measure, name, pp, m, chunks)
    return span, 1 - busy / (pp * span)


def tp_small_collectives(model: ModelSpec, layout: Layout) -> list[dict[str, list[tuple]]]:
    """Per pipeline stage, the tensor-parallel collectives besides the layers' 2 + 2 (the module
    docstring says where each comes from): ``{"forward": [...], "backward": [...]}`` of one
    micro-batch and ``"step": [...]`` once per step after the last backward (SP's replicated
    grads), each entry ``(collective, S in elements, count)`` with nccl-tests' S (all-gather and
    reduce-scatter: the whole [s', b, h]). Empty with one tensor-parallel rank."""
    t, h = layout.tp, model.hidden
    tokens = model.seq_len // layout.cp * layout.microbatch
    sp = layout.sequence_parallel
    out = []
    for r, n in enumerate(rank_layers(model, layout)):
        fwd, bwd, step = [], [], []
        if t > 1:
            per_layer = 2 * NORMS[model.norm] + (2 if model.bias else 0)
            if sp:                      # one all-reduce of every replicated grad, once per step
                rep = per_layer * n + (NORMS[model.norm] if r == layout.pp - 1 else 0)
                step.append(("all-reduce", rep * h, 1))
            if r == 0:                  # vocabulary-parallel embedding: g; under SP, split
                fwd.append(("all-reduce", tokens * h, 1))
                if sp:
                    bwd.append(("all-gather", tokens * h, 1))
            if r == layout.pp - 1:      # LM head, vocabulary-parallel cross-entropy
                if sp:
                    fwd.append(("all-gather", tokens * h, 1))
                    bwd.append(("reduce-scatter", tokens * h, 1))
                else:
                    bwd.append(("all-reduce", tokens * h, 1))
                fwd += [("all-reduce", tokens, 1), ("all-reduce", 2 * tokens, 1)]
        out.append({"forward": fwd, "backward": bwd, "step": step})
    return out


def _per_stage(model: ModelSpec, layout: Layout, layer: tuple[float, float, float],
               logits: tuple[float, float]) -> list[tuple[float, float]]:
    """Per pipeline stage (forward, backward) of one micro-batch, from one layer's (forward,
    backward, attention's forward) and the output layer's (forward, backward) on the last stage,
    recompute's extra forward added (selective: attention's, when its scores are stored)."""
    fwd, bwd, attn = layer
    selective = attn if layout.attention == "materialized" else 0.0   # flash: nothing stored
    extra = {"none": 0.0, "selective": selective, "full": fwd}[layout.recompute]
    last = layout.pp - 1
    return [(n * fwd + (logits[0] if r == last else 0.0), n * (bwd + extra) + (logits[1] if r == last else 0.0))
            for r, n in enumerate(rank_layers(model, layout))]


def stage_compute(model: ModelSpec, layout: Layout, rate: float) -> list[tuple[float, float]]:
    """Per pipeline stage: seconds of computation of one micro-batch's forward and backward at
    ``rate`` FLOP/s (its layers, the output layer on the last stage, recompute's extra forward)."""
    t, h = layout.tp, model.hidden
    tokens = model.seq_len // layout.cp * layout.microbatch
    attn_f = 4 * model.seq_len * h * tokens / t
    layer_f = 2 * tokens * matmul_params(model) / t + attn_f
    logits = 2 * tokens * model.vocab * h / t               # the output layer, last stage
    return [(f / rate, b / rate)
            for f, b in _per_stage(model, layout, (layer_f, 2 * layer_f, attn_f), (logits, 2 * logits))]


def stage_seconds(model: ModelSpec, cluster: ClusterSpec,
                  layout: Layout) -> tuple[list[tuple[float, float]], float]:
    """Per pipeline stage: seconds of one micro-batch's forward and backward from the cluster's
    measured compute curve (see the module docstring); and one layer's attention forward."""
    g = cluster.compute
    parts = layer_breakdown(model, cluster, layout.tp, layout.microbatch, cp=layout.cp,
                            sequence_parallel=layout.sequence_parallel,
                            attention=layout.attention, dtype_bytes=layout.dtype_bytes)
    fwd, bwd = (sum(p[i] for p in parts.values()) for i in (0, 1))
    attn = parts["attention"][0]
    tokens = model.seq_len // layout.cp * layout.microbatch
    rows = vocab_rows(model, layout.tp)
    logits = (g.matmul_seconds(tokens, model.hidden, rows),     # the output layer, last stage
              g.matmul_seconds(tokens, rows, model.hidden) + g.matmul_seconds(model.hidden, tokens, rows))
    return _per_stage(model, layout, (fwd, bwd, attn), logits), attn


def step_time(model: ModelSpec, cluster: ClusterSpec, layout: Layout,
              efficiency: float | None = None, overlap: bool = True) -> StepTime:
    """Predicted seconds of one step (see the module docstring). ``efficiency``: None to take
    compute from the cluster's measured GPU (``layer_seconds``), or the fraction of
    ``cluster.peak_flops`` every matmul reaches, your assumption. The returned ``mfu`` (model FLOPs
    utilization) is what the whole step achieves once bubble, communication and recompute are
    paid: a result, not an input."""
    L, t, c, d = layout, layout.tp, layout.cp, layout.dtype_bytes
    s, b, h = model.seq_len // c, layout.microbatch, model.hidden
    tokens = s * b                                           # per micro-batch on one rank
    if efficiency is None:
        compute, attn_seconds = stage_seconds(model, cluster, layout)
    else:
        efficiency = positive("efficiency", efficiency)
        if efficiency > 1:
            raise ValueError(f"efficiency must be at most 1 (a fraction of peak), got {efficiency}")
        rate = cluster.peak_flops * efficiency
        compute = stage_compute(model, layout, rate)
        attn_seconds = 4 * model.seq_len * h * tokens / t / rate   # scores + weighted sum, forward
    act_bytes = tokens * h * d
    tp_link = group_link(cluster, t)
    tp_ar = _time("all-reduce", act_bytes, t, tp_link)
    tp_fwd, tp_bwd = 2 * tp_ar, (2 + (2 if L.recompute == "full" else 0)) * tp_ar
    kv_bytes = 2 * tokens * model.kv_heads * model.head_dim / t * d     # this rank's K and V
    cp_link = group_link(cluster, t * c)
    hop = _time("send/recv", kv_bytes, 2, cp_link) * (c - 1) if c > 1 else 0.0
    # backward: K, V, dK, dV in one message per hop, then the finished dK, dV go home
    hop_b = (_time("send/recv", 2 * kv_bytes, 2, cp_link) * (c - 1)
             + _time("send/recv", kv_bytes, 2, cp_link)) if c > 1 else 0.0
    hide = attn_seconds if overlap else 0.0                  # ring hops run beside attention
    cp_fwd, cp_bwd = max(0.0, hop - hide), max(0.0, hop_b - 2 * hide)
    a2a = _time("all-to-all", tokens * model.top_k * h * d, L.ep, group_link(cluster, t * c * L.ep)) \
        if model.experts > 1 else 0.0
    per_layer_comm = (tp_fwd + cp_fwd + 2 * a2a, tp_bwd + cp_bwd + 2 * a2a)
    stages = rank_layers(model, L)
    small_tp = tp_small_collectives(model, L)

    def seconds(entries: list[tuple]) -> float:
        return sum(n * _time(kind, elements * d, t, tp_link) for kind, elements, n in entries)
    small = [(seconds(st["forward"]), seconds(st["backward"])) for st in small_tp]
    # once per step, after each stage's last backward (SP's replicated grads): the slowest stage's
    finalize = max(seconds(st["step"]) for st in small_tp)
    # the slowest stage sets the pace of every stage (the simulator takes one time per op)
    ops = [(fc + n * per_layer_comm[0] + sf, bc + n * per_layer_comm[1] + sb, r)
           for r, ((fc, bc), n, (sf, sb)) in enumerate(zip(compute, stages, small))]
    f, bwd, slowest = max(ops, key=lambda o: o[0] + o[1])
    fwd_c, bwd_c = compute[slowest]
    layers = stages[slowest]
    tp_small = sum(small[slowest])
    p2p_bytes = tokens * h * d / (t if L.sequence_parallel else 1)
    stride = t * c * L.dp                                    # pipeline neighbours are this far apart
    p2p = _time("send/recv", p2p_bytes, 2, group_link(cluster, stride + 1)) if L.pp > 1 else 0.0
    m = L.grad_accum
    # ratios rounded so that plan()'s layouts share simulations (the backward's share to 0.1 of a
    # forward, the latency to one significant digit), the backward's rounding put back below
    ratio = round(bwd / f, 1)
    span, bubble = _pipeline(L.schedule, L.pp, m, L.chunks, ratio, float(f"{p2p / f:.1g}"))
    # the rounding's own error put back: every stage runs m backwards of bwd, not ratio * f
    makespan = span * f + m * (bwd - ratio * f) if L.pp > 1 else m * (f + bwd)
    # data parallel: this rank's gradient / parameter bytes over the dp x cp ranks sharing them
    per = layer_params(model, t, L.ep)
    dense = max(stage_params(model, L, r)["dense"] for r in range(L.pp))
    experts = layers * per["experts"]
    n_dp, dp_link = L.dp * c, group_link(cluster, t * c * L.dp)
    n_ep = max(1, n_dp // L.ep)
    grads = "reduce-scatter" if L.zero_stage else "all-reduce"
    reduce = _time(grads, dense * d, n_dp, dp_link) + _time(grads, experts * d, n_ep, dp_link)
    gather = (_time("all-gather", dense * d, n_dp, dp_link)
              + _time("all-gather", experts * d, n_ep, dp_link)) if L.zero_stage else 0.0
    if L.zero_stage == 3:      # every micro-batch: gather for forward and backward, reduce grads
        total = m * (2 * gather + reduce)
        exposed = m * max(0.0, 2 * gather + reduce - (f + bwd)) if overlap else total
    else:
        total = reduce + gather
        exposed = (max(0.0, reduce - bwd) + max(0.0, gather - f)) if overlap else total
    step = makespan + exposed + finalize
    terms = {"compute": m * (fwd_c + bwd_c),
             "tensor parallel": m * (layers * (tp_fwd + tp_bwd) + tp_small) + finalize,
             "context parallel": m * layers * (cp_fwd + cp_bwd),
             "expert parallel": m * layers * 4 * a2a,
             "pipeline bubble and p2p": makespan - m * (f + bwd),
             "data parallel": exposed}
    hidden = {"data parallel": total - exposed,
              "context parallel": m * layers * (hop + hop_b) - terms["context parallel"]}
    global_tokens = L.global_batch * model.seq_len
    achieved = model_flops_per_token(model) * global_tokens / (step * cluster.peak_flops
                                                               * L.world_size)
    return StepTime(step, terms, hidden, global_tokens / step, achieved, bubble)
