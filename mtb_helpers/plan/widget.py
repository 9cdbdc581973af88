"""The layout explorer: model, GPUs, GPU memory, global batch and the matmul efficiency you assume -> the
fastest layouts that fit, why the others do not, and the memory each rank of the best one holds.
Arithmetic only (no rank starts)."""
from __future__ import annotations

import ipywidgets as widgets

from mtb_helpers.plan.plots import plot_stage_memory, plot_step_times
from mtb_helpers.plan.presets import MODELS, cluster, model
from mtb_helpers.plan.search import plan
from mtb_helpers.widgets.frame import live_view

__all__ = ["layout_explorer", "explore"]

GPU_CHOICES = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
BATCH_CHOICES = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def explore(name: str, gpus: int, memory_gib: float, global_batch: int, efficiency: float,
            top: int = 6) -> list:
    """What the explorer shows for one setting: the table, the step-time bars of the ``top``
    fastest layouts and the memory of the fastest one per pipeline stage (or the refusals)."""
    spec, machine = model(name), cluster("h100", gpus, memory_gib)
    # a smaller search than plan()'s default, so that a slider answers at once: ZeRO-1 (DDP for
    # comparison), the three recompute modes, one or two sequences per micro-batch
    # plan()'s ``mfu`` argument is the matmul efficiency it hands to step_time
    result = plan(spec, machine, global_batch, mfu=efficiency, microbatches=(1, 2), zero_stages=(0, 1),
                  cp_sizes=(1, 2, 4, 8) if spec.seq_len >= 32768 else (1,))
    items: list = [result.table(top)]
    if result.ranked:
        best = result.ranked[0]
        items.append(plot_step_times([(c.layout.short(), c.time.terms)
                                      for c in result.ranked[:top]],
                                     f"{spec.name} on {machine.name}: predicted step time, "
                                     f"matmuls at {efficiency:.0%} of peak (assumed)"))
        items.append(plot_stage_memory(best.memory, best.layout.short(), machine.memory_bytes,
                                       best.layout.tp * best.layout.cp * best.layout.dp))
    return items


def layout_explorer(name: str = "llama3-8b", gpus: int = 64, memory_gib: float = 80.0,
                    global_batch: int = 1024, efficiency: float = 0.5) -> widgets.VBox:
    """Controls on top, the ranked layouts and figures below (redrawn on every change)."""
    pick = widgets.Dropdown(options=[m for m in MODELS if m != "tiny-gpt"], value=name,
                            description="model")
    n = widgets.Dropdown(options=GPU_CHOICES, value=gpus, description="GPUs")
    mem = widgets.FloatSlider(value=memory_gib, min=16, max=192, step=8, description="GiB/GPU")
    batch = widgets.Dropdown(options=BATCH_CHOICES, value=global_batch, description="batch")
    rate = widgets.FloatSlider(value=efficiency, min=0.2, max=0.8, step=0.05, description="matmul eff.")
    return live_view([[pick, n], [mem, batch, rate]],
                     lambda: explore(pick.value, n.value, mem.value, batch.value, rate.value))
