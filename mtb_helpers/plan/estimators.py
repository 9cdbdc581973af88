"""The planner's model states next to DeepSpeed's own estimators, every difference named.

DeepSpeed ships two functions that answer "how much GPU memory do ZeRO's model states need"
(``deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs`` and
``deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs``; both pure arithmetic,
importable on a CPU without building any op). Without offloading they return, for Ψ parameters on
N = nodes x GPUs per node::

    ZeRO-2   2Ψ + int(18Ψ/N)                     (their comment: 16-bit params 2; 16-bit grads 2,
                                                  fp32 grads 4, fp32 params 4, Adam 8, sharded)
    ZeRO-3   4 L + int(18Ψ/N)                    (L: the largest layer's parameter count)

and the ZeRO paper's accounting (``model_state_bytes``) says ``2Ψ + 14Ψ/N`` and ``16Ψ/N``. The
differences are buffers the paper leaves out:

    ZeRO-2   + 4Ψ/N   the averaged gradient shard kept in fp32 for the optimizer step
    ZeRO-3   + 2Ψ/N   the same fp32 gradient shard, in place of the paper's 16-bit one (2 -> 4)
             + 4 L    one layer gathered whole: its 16-bit parameters and its 16-bit gradients

``RECORDED`` holds DeepSpeed 0.19.8's answers, made with::

    pip install deepspeed==0.19.8     # pure Python sdist; DS_BUILD_OPS=0 is the default
    python -c "from deepspeed.runtime.zero.stage_1_and_2 import \\
        estimate_zero2_model_states_mem_needs as z2; print(z2(7500000000, 8, 8, cpu_offload=False))"

(and ``estimate_zero3_model_states_mem_needs(Ψ, L, 8, nodes, cpu_offload=False)``), so the notebook
can show them without DeepSpeed installed; ``tests/test_plan_deepspeed.py`` calls DeepSpeed
itself and holds both to these numbers.
"""
from __future__ import annotations

from mtb_helpers.plan.memory import model_state_bytes
from mtb_helpers.plan.specs import positive_int

__all__ = ["RECORDED", "deepspeed_extras", "side_by_side", "deepspeed_estimates"]

# (Ψ, largest layer L, GPUs per node, nodes) -> (ZeRO-2 GPU bytes, ZeRO-3 GPU bytes), DeepSpeed 0.19.8
RECORDED: dict[tuple[int, int, int, int], tuple[int, int]] = {
    (7_500_000_000, 4 * 4096 * 4096, 8, 8): (17_109_375_000, 2_377_810_456),       # ZeRO's 7.5B, N = 64
    (8_030_261_248, 128256 * 4096, 8, 1): (34_128_610_304, 20_169_434_112),        # Llama 3 8B, one node
    (70_553_706_496, 128256 * 8192, 8, 4): (180_793_872_896, 43_889_152_512),      # Llama 3 70B, 32 GPUs
}


def deepspeed_extras(num_params: int, largest_layer: int, gpus: int) -> dict[int, dict[str, float]]:
    """{stage: {buffer: bytes}}: what DeepSpeed's estimator counts beyond the ZeRO paper."""
    psi, n = num_params, positive_int("gpus", gpus)
    return {2: {"fp32 gradient shard (4 bytes / N)": 4 * psi / n},
            3: {"fp32 instead of 16-bit gradient shard (+2 bytes / N)": 2 * psi / n,
                "largest layer gathered: 16-bit parameters and gradients (4 L)": 4 * largest_layer}}


def side_by_side(num_params: int, largest_layer: int, gpus_per_node: int, nodes: int) -> list[dict]:
    """One row per ZeRO stage (2, 3): the paper's bytes per GPU (``model_state_bytes``), each
    buffer DeepSpeed adds, their sum rounded down as DeepSpeed rounds, and DeepSpeed's recorded
    answer when ``RECORDED`` has these inputs (else None)."""
    positive_int("num_params", num_params)
    positive_int("largest_layer", largest_layer)
    n = positive_int("gpus_per_node", gpus_per_node) * positive_int("nodes", nodes)
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
