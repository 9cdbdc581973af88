"""Memory per rank, term by term: model states (the ZeRO paper's accounting) and activations
(Korthikanti et al. 2022's), for any layout. Arithmetic only.

**Model states** (Rajbhandari et al. 2020, "ZeRO", sec. 3.1 and Figure 1): mixed-precision Adam
keeps 2Ψ bytes of 16-bit parameters, 2Ψ of 16-bit gradients and KΨ of optimizer state (K = 12:
fp32 master weights, momentum and variance). Over N data-parallel ranks::

    stage 0 (DDP)   2Ψ + 2Ψ + KΨ          stage 2 (P_os+g)    2Ψ + (2 + K)Ψ/N
    stage 1 (P_os)  2Ψ + 2Ψ + KΨ/N        stage 3 (P_os+g+p)  (2 + 2 + K)Ψ/N

The paper's example: Ψ = 7.5e9, N = 64 -> 120 GB, 31.4, 16.6, 1.88 GB (decimal GB, 1e9 bytes:
16 x 7.5e9 = 120e9 exactly). Implementations pad the flat buffer to a multiple of N so every
rank's shard is equal (``pad=True``: ceil(Ψ/N) per rank; the course's ZeRO-1 does it too).

**Activations** (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", sec. 4, Table 2), per layer and micro-batch, 16-bit activations, 1-byte dropout masks,
s sequence, b micro-batch, h hidden, a heads, t tensor-parallel ranks::

    no parallelism                  sbh (34 + 5as/h)
    tensor parallel                 sbh (10 + 24/t + 5as/(ht))
    tensor + sequence parallel      sbh/t (34 + 5as/h)
    tensor parallel + selective     sbh (10 + 24/t)
    tensor + sequence + selective   sbh (34/t)
    full recompute                  2sbh  (the layer's input only; /t under sequence parallelism)

34 = attention 11 (QKV input 2, Q and K 4, V 2, projection input 2, dropout mask 1) + MLP 19 (fc1
input 2, GeLU input 8, fc2 input 8, dropout mask 1) + two LayerNorm inputs 4; 5as^2b = softmax
output 2, its dropout mask 1, dropout output 2. The terms below are those, written for any MLP
width f, grouped-query K/V, no dropout, and experts (every token's MLP runs top_k times). With
the defaults (f = 4h, MHA, dropout, ``attention="materialized"``) they are the table.

**Attention by kernel** (``attention``): "materialized" keeps the 5as^2b above (the paper's
count; SDPA's math path keeps even more, 183 sbh for GPT-3 where the paper counts 114, measured in
``measured/``). "flash" is a fused kernel (FlashAttention, Dao et al. 2022; PyTorch's SDPA):
it keeps Q, K, V, its output (which is the projection's input: one tensor) and the softmax
statistics, 4 bytes per query and head (fp32), and recomputes the scores in backward; its
dropout keeps a random seed, not a mask. That is what selective recompute does by hand, and why
fused kernels made it the default. The planner uses "flash" (``Layout.attention``).

**Gated MLPs** (SwiGLU) are counted as PyTorch eager keeps them: four [s, f] tensors (gate and
up outputs, silu(gate), and their product, the down projection's input). A fused SwiGLU kernel
(``fused_swiglu``, Megatron-LM's ``bias_swiglu``) saves only its input, gate and up, and
recomputes silu(gate) in backward: three with the product. One layer of Llama 3 8B keeps 41 sbh with
FlashAttention (the H200 measurement in ``measured/``: 40.03 by its count, which sees each
layer's input at half, see ``mtb_helpers.plan.compute``).
**DeepSpeed's estimators** (``estimate_zero2_model_states_mem_needs`` in
``deepspeed.runtime.zero.stage_1_and_2``, ``estimate_zero3_model_states_mem_needs`` in
``deepspeed.runtime.zero.stage3``; pure arithmetic) answer ``2Ψ + int(18Ψ/N)`` (ZeRO-2; 18: 16-bit
grads 2, fp32 grads 4, fp32 params 4, Adam 8) and ``4 L + int(18Ψ/N)`` (ZeRO-3, L the largest
layer's parameter count) without offloading, where the
paper says ``2Ψ + 14Ψ/N`` and ``16Ψ/N``: ZeRO-2 adds the averaged gradient shard kept in fp32 for
the optimizer step (4Ψ/N), ZeRO-3 the same fp32 shard in place of the paper's 16-bit one (+2Ψ/N)
and one layer gathered whole, its 16-bit parameters and gradients (4 bytes x L): ``side_by_side``.
``RECORDED`` holds DeepSpeed 0.19.8's answers (``pip install deepspeed==0.19.8``, a pure Python
sdist, then ``estimate_zero2_model_states_mem_needs(Ψ, 8, nodes, cpu_offload=False)`` and
``estimate_zero3_model_states_mem_needs(Ψ, L, 8, nodes, cpu_offload=False)``), so the notebook
shows them without DeepSpeed installed; ``tests/test_plan_deepspeed.py`` asks DeepSpeed itself.
"""
from __future__ import annotations

import math

from mtb_helpers.cost.model import one_of, positive, whole
from mtb_helpers.plan.specs import ATTENTION, NORMS, RECOMPUTE, linears, tp_problems

__all__ = ["MemoryModel", "model_state_bytes", "activation_bytes_per_layer", "ATTENTION_TERMS",
           "MLP_TERMS", "STATE_TERMS", "RECORDED", "deepspeed_extras", "side_by_side",
           "deepspeed_estimates"]

ATTENTION_TERMS = ("ln1 input", "qkv input", "q and k", "v", "attention scores",
                   "projection input", "attention dropout mask")
MLP_TERMS = ("ln2 input", "fc1 input", "mlp hidden", "mlp dropout mask")
STATE_TERMS = ("parameters", "gradients", "optimizer states")


class MemoryModel:
    """The formulas, as methods so that a deliberate bug (``plan/bugs.py``) can override one.
    ``memory.py``'s functions and the planner use ``MemoryModel()``."""

    def layer_params(self, model, tp: int = 1, ep: int = 1) -> dict[str, float]:
        """Parameters of one layer of ``model`` (a ``ModelSpec``) on one rank: ``{"dense",
        "experts"}`` (the experts' share this rank holds; the router counts as dense): the
        matmuls' weights and biases as ``specs.linears`` splits them, and the norms, whole on
        every tensor rank (Megatron-LM, and the capstone's ``layers.py``)."""
        if tp_problems(model, tp):
            raise ValueError("; ".join(tp_problems(model, tp)))
        h = model.hidden
        weights = {False: 0.0, True: 0.0}            # in the MLP -> parameters on this rank
        for n_in, n_out, in_mlp in linears(model, tp):
            weights[in_mlp] += n_in * n_out + (n_out if model.bias else 0)
        attn, mlp = weights[False], weights[True]
        norms = 2 * NORMS[model.norm] * h
        if model.experts == 1:
            return {"dense": attn + norms + mlp, "experts": 0.0}
        return {"dense": attn + norms + h * model.experts, "experts": mlp * model.experts / ep}

    def model_states(self, num_params: float, dp: int, zero_stage: int,
                     optimizer_bytes_per_param: float = 12, param_bytes: float = 2,
                     grad_bytes: float = 2, pad: bool = False) -> dict[str, float]:
        """Bytes per rank ``{parameters, gradients, optimizer states}`` of ``num_params`` parameters
        over ``dp`` ranks at ZeRO ``zero_stage``; ``pad``: shards are ``ceil(Ψ/N)`` (and the
        unsharded flat buffers ``N ceil(Ψ/N)``), as implementations lay them out."""
        psi = positive("num_params", num_params)
        n = whole("dp", dp)
        one_of("zero_stage", zero_stage, (0, 1, 2, 3))
        for name, v in (("optimizer_bytes_per_param", optimizer_bytes_per_param),
                        ("param_bytes", param_bytes), ("grad_bytes", grad_bytes)):
            positive(name, v)
        shard = math.ceil(psi / n) if pad and zero_stage else psi / n
        full = shard * n if pad and zero_stage else psi
        return {"parameters": param_bytes * (shard if zero_stage >= 3 else full),
                "gradients": grad_bytes * (shard if zero_stage >= 2 else full),
                "optimizer states": optimizer_bytes_per_param * (shard if zero_stage >= 1 else psi)}

    def activation_terms(self, seq: int, batch: int, hidden: int, heads: int, tp: int = 1,
                         sequence_parallel: bool = False, recompute: str = "none", *,
                         kv_heads: int | None = None, ffn_hidden: int | None = None,
                         gated_mlp: bool = False, dropout: bool = True, top_k: int = 1,
                         dtype_bytes: int = 2, attention: str = "materialized",
                         fused_swiglu: bool = False) -> dict[str, float]:
        """Bytes one layer keeps for backward per micro-batch on one tensor-parallel rank, by term
        (``ATTENTION_TERMS + MLP_TERMS``, or ``{"layer input"}`` under full recompute). Under
        ``attention="flash"`` the "attention scores" term holds the kernel's softmax statistics
        (fp32, one per query and head)."""
        s, b, h, a, t = (whole(n, v) for n, v in (("seq", seq), ("batch", batch), ("hidden", hidden),
                                                  ("heads", heads), ("tp", tp)))
        kv = a if kv_heads is None else whole("kv_heads", kv_heads)
        f = 4 * h if ffn_hidden is None else whole("ffn_hidden", ffn_hidden)
        whole("top_k", top_k)
        whole("dtype_bytes", dtype_bytes)
        one_of("recompute", recompute, RECOMPUTE)
        one_of("attention", attention, ATTENTION)
        if h % a:
            raise ValueError(f"hidden={h} is not divisible by heads={a}")
        if a % t or kv % t:
            raise ValueError(f"heads={a} (kv_heads={kv}) is not divisible by tp={t}")
        if sequence_parallel and s % t:
            raise ValueError(f"seq={s} is not divisible by tp={t}: sequence parallelism splits it")
        sbh, d = s * b * h, dtype_bytes
        rep = t if sequence_parallel else 1      # what the sequence-split terms divide by
        if recompute == "full":
            return {"layer input": d * sbh / rep}
        mask = 1 if dropout else 0
        if attention == "flash":                 # softmax statistics only: fp32 [b, a, s]
            scores = 4.0 * a * s * b
        else:
            scores = 0.0 if recompute == "selective" else (2 * d + 1 if dropout else d) * a * s * s * b
        return {
            "ln1 input": d * sbh / rep,
            "qkv input": d * sbh / rep,
            "q and k": d * sbh * (1 + kv / a) / t,
            "v": d * sbh * kv / a / t,
            "attention scores": scores / t,
            "projection input": d * sbh / t,
            "attention dropout mask": mask * sbh / rep,
            "ln2 input": d * sbh / rep,
            "fc1 input": top_k * d * sbh / rep,
            # eager SwiGLU keeps gate, up, silu(gate) and their product (fused: not silu(gate));
            # GeLU its input and output
            "mlp hidden": top_k * ((3 if fused_swiglu else 4) if gated_mlp else 2) * d * s * b * f / t,
            "mlp dropout mask": mask * sbh / rep,
        }


def model_state_bytes(num_params: float, dp: int, zero_stage: int,
                      optimizer_bytes_per_param: float = 12) -> float:
    """Parameters + gradients + optimizer state per rank in mixed-precision training, bytes: the
    ZeRO paper's ``(2 + 2 + K)Ψ`` split over ``dp`` ranks by stage (see the module docstring).

    >>> model_state_bytes(7.5e9, dp=64, zero_stage=3)    # the paper's 1.88 GB
    1875000000.0
    """
    return sum(MemoryModel().model_states(num_params, dp, zero_stage,
                                          optimizer_bytes_per_param).values())


def activation_bytes_per_layer(seq: int, batch: int, hidden: int, heads: int, tp: int = 1,
                               sequence_parallel: bool = False, recompute: str = "none",
                               **details) -> float:
    """Activation bytes of one transformer layer per micro-batch on one tensor-parallel rank: the
    sum of ``MemoryModel.activation_terms``. By default Korthikanti et al.'s count,
    ``sbh(34 + 5as/h)`` without parallelism, and the module docstring's table for ``tp``,
    ``sequence_parallel`` and ``recompute``. ``details`` (``attention``, ``kv_heads``,
    ``ffn_hidden``, ``gated_mlp``, ``dropout``, ``top_k``, ``dtype_bytes``, ``fused_swiglu``)
    describe models the paper's defaults do not.

    >>> activation_bytes_per_layer(2048, 1, 12288, 96)   # GPT-3: sbh (34 + 80)
    2868903936.0
    """
    return sum(MemoryModel().activation_terms(seq, batch, hidden, heads, tp, sequence_parallel,
                                              recompute, **details).values())


# (Ψ, largest layer L, GPUs per node, nodes) -> (ZeRO-2 GPU bytes, ZeRO-3 GPU bytes), DeepSpeed 0.19.8
RECORDED: dict[tuple[int, int, int, int], tuple[int, int]] = {
    (7_500_000_000, 4 * 4096 * 4096, 8, 8): (17_109_375_000, 2_377_810_456),       # ZeRO's 7.5B, N = 64
    (8_030_261_248, 128256 * 4096, 8, 1): (34_128_610_304, 20_169_434_112),        # Llama 3 8B, one node
    (70_553_706_496, 128256 * 8192, 8, 4): (180_793_872_896, 43_889_152_512),      # Llama 3 70B, 32 GPUs
}


def deepspeed_extras(num_params: int, largest_layer: int, gpus: int) -> dict[int, dict[str, float]]:
    """{stage: {buffer: bytes}}: what DeepSpeed's estimator counts beyond the ZeRO paper."""
    psi, n = num_params, whole("gpus", gpus)
    return {2: {"fp32 gradient shard (4Ψ/dp)": 4 * psi / n},
            3: {"fp32 instead of 16-bit gradient shard (+2Ψ/dp)": 2 * psi / n,
                "largest layer gathered: its 16-bit parameters and gradients (4 bytes each)": 4 * largest_layer}}


def side_by_side(num_params: int, largest_layer: int, gpus_per_node: int, nodes: int) -> list[dict]:
    """One row per ZeRO stage (2, 3): the paper's bytes per GPU (``model_state_bytes``), each
    buffer DeepSpeed adds, their sum rounded down as DeepSpeed rounds, and DeepSpeed's recorded
    answer when ``RECORDED`` has these inputs (else None)."""
    whole("num_params", num_params)
    whole("largest_layer", largest_layer)
    n = whole("gpus_per_node", gpus_per_node) * whole("nodes", nodes)
    recorded = RECORDED.get((num_params, largest_layer, gpus_per_node, nodes))
    rows = []
    for i, (stage, extras) in enumerate(deepspeed_extras(num_params, largest_layer, n).items()):
        ours = model_state_bytes(num_params, n, stage)
        rows.append({"stage": stage, "zero_paper": ours, "extras": extras,
                     "explained": int(ours + sum(extras.values())),
                     "deepspeed": None if recorded is None else recorded[i]})
    return rows


def deepspeed_estimates(num_params: int, largest_layer: int, gpus_per_node: int,
                        nodes: int) -> tuple[int, int]:
    """DeepSpeed's own answers, asked now: (ZeRO-2, ZeRO-3) GPU bytes without offloading.
    Needs ``pip install deepspeed==0.19.8`` (the ``test`` extra installs it)."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    _, zero2 = estimate_zero2_model_states_mem_needs(num_params, gpus_per_node, nodes,
                                                     cpu_offload=False)
    _, zero3, _ = estimate_zero3_model_states_mem_needs(num_params, largest_layer, gpus_per_node,
                                                        nodes, cpu_offload=False)
    return int(zero2), int(zero3)
