"""The planner against a real GPU: every measured layer beside the planner's prediction.

    rows = against_measurements()                       # the H200 rows in measured/
    rows = against_measurements("my_gpu.json")          # what benchmarks/gpu_layer.py wrote
    print(gap_table(rows))

Memory rows compare the bytes one layer's autograd graph keeps (FlashAttention rows, and
materialized rows when asked) with ``MemoryModel.activation_terms``. The H200 rows were taken
as ``memory_allocated`` after the forward of 2 layers minus before, minus the output, over 2:
the first layer's input existed before, so each layer's input is seen at half (the measured
full-recompute row, 1.0 sbh against the planner's 2, shows it); the prediction is put in the
same terms (``input_counted``). ``benchmarks/gpu_layer.py`` counts the saved tensors themselves,
input included (``input_counted = 1``).

Time rows compare forward+backward milliseconds of one layer, or of one tensor-parallel rank's
share of one (no communication), with ``layer_seconds`` on the measured GPU's compute curve;
under full recompute with one more forward.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtb_helpers.plan.compute import GPUCompute, h200_compute, layer_breakdown, measured_rows, measurement
from mtb_helpers.plan.memory import MemoryModel
from mtb_helpers.plan.presets import model
from mtb_helpers.plan.specs import ModelSpec

__all__ = ["GapRow", "against_measurements", "gap_table", "row_model", "memory_rows", "time_rows"]


@dataclass(frozen=True)
class GapRow:
    """One measurement beside its prediction: ``kind`` "memory" (bytes) or "time" (seconds)."""
    kind: str
    label: str
    measured: float
    predicted: float

    @property
    def gap(self) -> float:
        """(predicted - measured) / measured."""
        return self.predicted / self.measured - 1


def row_model(row: dict[str, Any]) -> ModelSpec:
    """The layer a row measured: its own ``model`` sizes, or the preset its case names at its
    sequence length (the tensor-parallel share of GPT-3 was measured without dropout)."""
    if "model" in row:
        return ModelSpec(**row["model"])
    name = row["case"].split()[0]
    spec = model(name).with_(seq_len=row["s"])
    return spec if row["case"].endswith("layer") else spec.with_(dropout=False)


def _attention(row: dict[str, Any]) -> str:
    return "flash" if row.get("attention", "flash_attention").startswith("flash") else "materialized"


def memory_rows(rows: list[dict[str, Any]], memory_model: MemoryModel | None = None,
                materialized: bool = False) -> list[GapRow]:
    """A memory ``GapRow`` per layer row with ``saved_bytes_per_layer`` (FlashAttention only
    unless ``materialized``)."""
    mm = memory_model or MemoryModel()
    out = []
    for r in rows:
        if "saved_bytes_per_layer" not in r or (_attention(r) != "flash" and not materialized):
            continue
        m, b = row_model(r), r.get("b", 1)
        terms = mm.activation_terms(m.seq_len, b, m.hidden, m.heads, 1, False,
                                    "full" if r.get("recompute") else "none", kv_heads=m.kv_heads,
                                    ffn_hidden=m.ffn_hidden, gated_mlp=m.gated_mlp,
                                    dropout=m.dropout, dtype_bytes=r.get("dtype_bytes", 2),
                                    attention=_attention(r), fused_swiglu=m.fused_swiglu)
        layer_input = r.get("dtype_bytes", 2) * m.seq_len * b * m.hidden
        seen = sum(terms.values()) - (1 - r.get("input_counted", 0.5)) * layer_input
        out.append(GapRow("memory", _label(r), r["saved_bytes_per_layer"], seen))
    return out


def time_rows(rows: list[dict[str, Any]], gpu: GPUCompute) -> list[GapRow]:
    """A time ``GapRow`` per FlashAttention row with ``ms_fwd_bwd``: a layer (``layer`` cases)
    or one tensor-parallel rank's share of one (rows with ``t``)."""
    out = []
    for r in rows:
        if "ms_fwd_bwd" not in r or _attention(r) != "flash":
            continue
        m = row_model(r)
        parts = layer_breakdown(m, gpu, r.get("t", 1), r.get("b", 1),
                                dtype_bytes=r.get("dtype_bytes", 2))
        forward = sum(f for f, _ in parts.values())
        seconds = sum(f + b for f, b in parts.values()) + (forward if r.get("recompute") else 0.0)
        out.append(GapRow("time", _label(r), r["ms_fwd_bwd"] * 1e-3, seconds))
    return out


def _label(r: dict[str, Any]) -> str:
    name = r["case"].replace(" layer", "")
    text = f"{name} s={r['s']}"
    if "t" in r:
        text += f" t={r['t']} b={r.get('b', 1)}"
    if r.get("recompute"):
        text += " full recompute"
    return text + ("" if _attention(r) == "flash" else " materialized")


def against_measurements(source: str | Path | None = None, *, gpu: GPUCompute | None = None,
                         memory_model: MemoryModel | None = None,
                         materialized: bool = False) -> list[GapRow]:
    """Memory rows then time rows, for the H200 rows in ``measured/`` (``source`` None) or a file
    ``benchmarks/gpu_layer.py`` wrote (its compute curve fitted from its own rows). ``gpu``
    replaces the compute curve, ``memory_model`` the memory formulas (a deliberate mistake)."""
    if source is None:
        rows = (measured_rows("h200_layer_memory_time.jsonl")
                + measured_rows("h200_tp_shard_time.jsonl"))
        curve = h200_compute()
    else:
        doc, curve = measurement(source)
        rows = doc["rows"]
    rows = [r for r in rows if "case" in r and "error" not in r]
    return memory_rows(rows, memory_model, materialized) + time_rows(rows, gpu or curve)


def gap_table(rows: list[GapRow]) -> str:
    """One line per row: what, measured, predicted, gap (memory in MiB, time in ms)."""
    lines = [f"{'':<6} {'layer':<40} {'measured':>10} {'planner':>10} {'gap':>7}"]
    for r in rows:
        scale, unit = (2 ** -20, "MiB") if r.kind == "memory" else (1e3, "ms")
        lines.append(f"{r.kind:<6} {r.label:<40} {r.measured * scale:>10.2f} "
                     f"{r.predicted * scale:>10.2f} {r.gap:>+7.1%}  {unit}")
    return "\n".join(lines)
