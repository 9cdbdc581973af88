"""Choosing a layout (notebook 15): memory and step time of tp x pp x dp x cp x ep for a real
model on a real cluster, from the course's own formulas. Arithmetic only: nothing is allocated
for a big model; only the tiny-model checks start ranks.

    from mtb_helpers.plan import model_state_bytes, activation_bytes_per_layer, plan
    model_state_bytes(7.5e9, dp=64, zero_stage=3)     # 1.875e9 bytes per rank (ZeRO, K = 12)
    activation_bytes_per_layer(2048, 1, 12288, 96, tp=8, sequence_parallel=True)
    activation_bytes_per_layer(8192, 1, 4096, 32, attention="flash", kv_heads=8, ffn_hidden=14336,
                               gated_mlp=True, dropout=False)   # what FlashAttention keeps
    layer_seconds(model("llama3-8b"), cluster("h200"), tp=8)     # one rank's share, fwd+bwd
"""
from mtb_helpers.plan.budget import (MEMORY_TERMS, StageMemory, layer_params, memory_per_rank,
                                     stage_params, total_params)
from mtb_helpers.plan.compute import GPUCompute, layer_breakdown, layer_seconds
from mtb_helpers.plan.memory import MemoryModel, activation_bytes_per_layer, model_state_bytes
from mtb_helpers.plan.presets import CLUSTERS, GIB, MODELS, cluster, cluster_from_measurement, model, tiny_gpt
from mtb_helpers.plan.published import NARAYANAN_2021_TABLE_1, Comparison, PublishedRow, compare
from mtb_helpers.plan.search import Candidate, PlanResult, plan
from mtb_helpers.plan.specs import (ClusterSpec, Layout, ModelSpec, check_layout,
                                    layout_problems, stage_layers)
from mtb_helpers.plan.steptime import StepTime, model_flops_per_token, step_time
from mtb_helpers.plan import bugs  # noqa: F401  registers the topic's bugs (checking/bug.py)

__all__ = ["ModelSpec", "ClusterSpec", "Layout", "MODELS", "CLUSTERS", "GIB", "model", "cluster",
           "tiny_gpt", "model_state_bytes", "activation_bytes_per_layer", "MemoryModel",
           "memory_per_rank", "StageMemory", "MEMORY_TERMS", "layer_params", "stage_params",
           "total_params", "layout_problems", "check_layout", "stage_layers", "plan",
           "PlanResult", "Candidate", "step_time", "StepTime", "model_flops_per_token",
           "NARAYANAN_2021_TABLE_1", "PublishedRow", "Comparison", "compare", "layer_seconds",
           "layer_breakdown", "GPUCompute", "cluster_from_measurement"]
