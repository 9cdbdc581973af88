"""How long one layer takes on one GPU, from measurements: ``layer_seconds``.

A layer's forward and backward is a list of operations; each costs what the GPU needs for one of
its size (a roofline whose matmul ceiling falls with the matrix's size):

  matmuls       (M x K) @ (K x N) takes ``2·M·N·(K + k0) / R`` seconds: a ceiling R, and k0 extra
                steps of the inner dimension that every product pays (its first tiles loaded, its
                result written). Fitted by least squares to the measured products that run for
                at least 50 µs (shorter ones measure the launch, which a busy stream hides). On
                the H200 (``measured/``): R = 740 TFLOP/s (75 % of the 989 peak), k0 = 182. A
                tensor-parallel shard shrinks the inner dimension of the output projection (a·d/t)
                and of the MLP's down projection (f/t): one reason smaller shards run slower.
                Forward Y = X W is (T x in) @ (in x out); backward dX is (T x out) @ (out x in)
                and dW is (in x T) @ (T x out).
  attention     FlashAttention's forward does ``2·s²·d`` FLOPs per head and sequence (causal:
                half of ``4·s²·d``), its backward 2.5 times that (five products against two), at
                the kernel's rate. Assumed, not measured here: FlashAttention-2 (PyTorch's SDPA
                flash backend) on an H100 SXM, head dim 128, as Shah et al. 2024 measured it
                ("FlashAttention-3", Figures 5 and 6): forward, causal, 191 to 335 TFLOP/s from
                s = 512 to 16k, backward 132 to 292 (``FLASH_ATTENTION_H100``); the same
                fractions of peak on another GPU (or the rates ``benchmarks/gpu_layer.py``
                measured on yours). With few heads on a rank the causal triangle's longest blocks
                leave SMs idle at the end (``_causal_tail``, relative to the benchmark's 16 heads x
                16k tokens): first principles, not fitted; it moves Llama 3 8B's t = 8 share from
                12 % to 4 % below the measurement, every other row by at most 3 points.
                Materialized attention instead runs its six products on the matmul curve (inner
                dimension d or s) and three memory-bound passes over the [a, s, s] scores (mask,
                softmax, dropout).
  memory-bound  norms, the MLP's activation, dropout and residual adds cost what the H200 measured
                for each, per element: its forward+backward in passes over the tensor at the
                nominal bandwidth (RMSNorm 16, GeLU 11, SiLU·x 23, residual add 8, ...), taken at
                the GPU's bandwidth. Besides (at the nominal bandwidth, not measured): gradient
                accumulation (read two, write one: 3 passes over the weights), each bias gradient
                (one pass over its output), the Q, K, V gradients copied into one (two passes).
                The forward is given a third of each op's time, the backward the rest.

Not counted: kernel launches (hidden while the GPU is busy), communication (``step_time`` adds
it), the embedding and output layer (``step_time`` adds the output layer as a matmul).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from mtb_helpers.cost.model import one_of, positive, whole
from mtb_helpers.plan.specs import ATTENTION, ModelSpec, linears, tp_problems

__all__ = ["GPUCompute", "fit_compute", "measured_rows", "measurement", "h200_compute", "layer_breakdown",
           "layer_seconds", "FLASH_ATTENTION_H100", "MIN_MATMUL_SECONDS"]

# FlashAttention-2 on an H100 SXM5, head dim 128 (Shah et al. 2024, "FlashAttention-3", Figures 5
# and 6): (sequence length, forward TFLOP/s causal, backward TFLOP/s). The paper's backward is
# without the causal mask; it is scaled by the forward's causal / non-causal ratio (191/309,
# 260/350, 298/362, 319/368, 333/370, 335/370). Used as fractions of the H100's 989 TFLOP/s.
FLASH_ATTENTION_H100 = ((512, 191e12, 132e12), (1024, 260e12, 193e12), (2048, 298e12, 240e12),
                        (4096, 319e12, 269e12), (8192, 333e12, 286e12), (16384, 335e12, 292e12))
MIN_MATMUL_SECONDS = 50e-6         # shorter measured products time their launch, not the GPU
OPS = ("layernorm", "rmsnorm", "gelu", "silu_mul", "residual_add", "dropout")


@dataclass(frozen=True)
class GPUCompute:
    """One GPU's speed as the planner counts it (the module docstring says how each is used).
    ``op_passes``: ``((op, passes), ...)``, an op's forward+backward in passes over its
    [tokens, width] tensor at ``bandwidth``; ``attention``: ``((s, forward fraction of peak,
    backward fraction of peak), ...)``, FlashAttention's rate by sequence length."""
    matmul_rate: float
    inner_overhead: float
    bandwidth: float
    peak_flops: float
    op_passes: tuple[tuple[str, float], ...]
    attention: tuple[tuple[int, float, float], ...]
    name: str = ""
    sms: int = 132

    def matmul_seconds(self, m: float, k: float, n: float) -> float:
        """Seconds of one (m x k) @ (k x n) product."""
        return 2 * m * n * (k + self.inner_overhead) / self.matmul_rate

    def op_seconds(self, op: str, elements: float, dtype_bytes: int = 2) -> float:
        """Forward+backward seconds of memory-bound ``op`` on ``elements`` elements."""
        table = dict(self.op_passes)
        if op not in table:
            raise ValueError(f"no measured cost for op {op!r}; measured: {', '.join(table)}")
        return table[op] * elements * dtype_bytes / self.bandwidth

    def flash_rate(self, seq: int) -> tuple[float, float]:
        """FlashAttention's (forward, backward) FLOP/s at sequence length ``seq`` (interpolated
        in log s, the end values beyond the measured lengths)."""
        pts = self.attention
        lo = max([p for p in pts if p[0] <= seq], default=pts[0], key=lambda p: p[0])
        hi = min([p for p in pts if p[0] >= seq], default=pts[-1], key=lambda p: p[0])
        w = 0.0 if hi[0] == lo[0] else math.log(seq / lo[0]) / math.log(hi[0] / lo[0])
        return tuple((a + w * (b - a)) * self.peak_flops for a, b in zip(lo[1:], hi[1:]))

    def with_bandwidth(self, bandwidth: float, name: str = "") -> "GPUCompute":
        """The same matmuls and per-op passes on a GPU with another memory bandwidth."""
        return replace(self, bandwidth=positive("bandwidth", bandwidth), name=name or self.name)


def measured_rows(name: str) -> list[dict[str, Any]]:
    """The rows of ``mtb_helpers/plan/measured/<name>`` (one JSON object a line; the first says how
    they were measured), shipped with the package."""
    text = resources.files("mtb_helpers.plan").joinpath("measured", name).read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def fit_compute(rows: list[dict[str, Any]], peak_flops: float, bandwidth: float,
                name: str = "", dtype_bytes: int = 2) -> GPUCompute:
    """A ``GPUCompute`` from measured rows: ``{"case": "gemm", M, K, N, us}`` (R and k0 by least
    squares on relative error, products of at least ``MIN_MATMUL_SECONDS``; rows that do not grow
    with K get one flat rate and k0 = 0), ``{"case": "memory-bound", op, tokens, h, us_fwd_bwd}``
    (each op's median passes) and, optional, ``{"case": "attention", s, heads, head_dim, batch,
    us_fwd, us_fwd_bwd}`` (FlashAttention's rates; else ``FLASH_ATTENTION_H100`` / peak)."""
    peak, bw = positive("peak_flops", peak_flops), positive("bandwidth", bandwidth)
    gemm = [r for r in rows if r.get("case") == "gemm" and r["us"] * 1e-6 >= MIN_MATMUL_SECONDS]
    if len(gemm) < 2:
        raise ValueError(f"need at least 2 matmul rows of >= {MIN_MATMUL_SECONDS * 1e6:.0f} us to "
                         f"fit the matmul curve, got {len(gemm)}")
    # t / (2MN) = K / R + k0 / R: a line in K, each row weighted by 1 / its value (relative error)
    xs = [r["K"] for r in gemm]
    ys = [r["us"] * 1e-6 / (2 * r["M"] * r["N"]) for r in gemm]
    ws = [1 / y ** 2 for y in ys]
    sw = sum(ws)
    mx, my = sum(w * x for w, x in zip(ws, xs)) / sw, sum(w * y for w, y in zip(ws, ys)) / sw
    slope = (sum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, ys))
             / sum(w * (x - mx) ** 2 for w, x in zip(ws, xs)))
    if slope > 0:
        rate, overhead = 1 / slope, max(0.0, (my - slope * mx) / slope)
    else:       # rows that do not grow with K (a busy CPU's dry run): one flat rate, said as k0 = 0
        rate = sum(2 * r["M"] * r["K"] * r["N"] for r in gemm) / sum(r["us"] * 1e-6 for r in gemm)
        overhead = 0.0
    passes = {}
    for op in OPS:
        got = sorted(bw * r["us_fwd_bwd"] * 1e-6 / (r["tokens"] * r["h"] * dtype_bytes)
                     for r in rows if r.get("case") == "memory-bound" and r["op"] == op)
        if got:
            passes[op] = got[len(got) // 2]
    flash = []
    for r in sorted((r for r in rows if r.get("case") == "attention"), key=lambda r: r["s"]):
        fwd = 2 * r["s"] ** 2 * r["head_dim"] * r["heads"] * r["batch"]      # causal
        flash.append((r["s"], fwd / (r["us_fwd"] * 1e-6) / peak,
                      2.5 * fwd / ((r["us_fwd_bwd"] - r["us_fwd"]) * 1e-6) / peak))
    attention = tuple(flash) or tuple((s, f / 989e12, b / 989e12)
                                      for s, f, b in FLASH_ATTENTION_H100)
    return GPUCompute(rate, overhead, bw, peak, tuple(passes.items()), attention, name)


def measurement(path: str | Path) -> tuple[dict[str, Any], GPUCompute]:
    """What ``benchmarks/gpu_layer.py --out path`` wrote, and the compute curve fitted to its rows;
    ValueError naming ``path`` when there is no such file or it is not one."""
    if not Path(path).is_file():
        raise ValueError(f"no measurement file at {str(path)!r} (write one with "
                         "python benchmarks/gpu_layer.py --out FILE)")
    try:
        doc = json.loads(Path(path).read_text())
        return doc, fit_compute(doc["rows"], doc["peak_flops"], doc["bandwidth"], doc["device"],
                                doc.get("dtype_bytes", 2))
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{str(path)!r} is not a measurement benchmarks/gpu_layer.py wrote: "
                         f"{type(e).__name__}: {e}") from None


@lru_cache(maxsize=1)
def h200_compute() -> GPUCompute:
    """The H200's curve, fitted to ``measured/h200_gemm_and_memory_bound.jsonl`` (989 TFLOP/s
    dense BF16 and 4.8 TB/s as NVIDIA lists them)."""
    return fit_compute(measured_rows("h200_gemm_and_memory_bound.jsonl"), 989e12, 4.8e12, "H200")


def _causal_tail(sequence_heads: int, seq: int, sms: int) -> float:
    """How much longer a causal FlashAttention takes than its work spread evenly over ``sms``
    SMs: block i of 128 queries sees i + 1 key blocks, so the work is a triangle, and the GPU
    finishes, on average, half a longest block after the rest (``(W/S + n/2) / (W/S)``)."""
    n = -(-seq // 128)
    per_sm = sequence_heads * n * (n + 1) / 2 / sms
    return (per_sm + n / 2) / per_sm


def layer_breakdown(model: ModelSpec, gpu: Any, tp: int = 1, microbatch: int = 1, *, cp: int = 1,
                    sequence_parallel: bool = False, attention: str = "flash",
                    dtype_bytes: int = 2) -> dict[str, tuple[float, float]]:
    """Seconds of one layer on one tensor-parallel rank, one micro-batch of ``microbatch``
    sequences of ``model.seq_len / cp`` tokens: ``{"matmuls", "attention", "memory-bound"}``, each
    ``(forward, backward)``. ``gpu``: a ``GPUCompute`` or a cluster that has one. Under
    ``sequence_parallel`` the norms, dropouts and residual adds run on ``tokens / tp`` rows."""
    g = getattr(gpu, "compute", gpu)
    if not isinstance(g, GPUCompute):
        raise ValueError(f"{getattr(gpu, 'name', None) or repr(gpu)} has no measured compute curve "
                         "(ClusterSpec.compute): give step_time an efficiency instead")
    t, b, c = whole("tp", tp), whole("microbatch", microbatch), whole("cp", cp)
    one_of("attention", attention, ATTENTION)
    if tp_problems(model, t):
        raise ValueError("; ".join(tp_problems(model, t)))
    if model.seq_len % c:
        raise ValueError(f"seq_len={model.seq_len} is not divisible by cp={c}")
    s, h, d, heads = model.seq_len, model.hidden, model.head_dim, model.heads // t
    tokens = s // c * b
    mm_f = mm_b = mem = 0.0
    weights = 0
    for n_in, n_out, mlp in linears(model, t):
        m = tokens * (model.top_k if mlp else 1)          # experts: every token's MLP top_k times
        mm_f += g.matmul_seconds(m, n_in, n_out)
        mm_b += g.matmul_seconds(m, n_out, n_in) + g.matmul_seconds(n_in, m, n_out)
        weights += n_in * n_out
        if model.bias:                                    # its gradient: one pass over dY
            mem += m * n_out * dtype_bytes / g.bandwidth
    q_len = s // c                                        # this rank's queries, all s keys
    if attention == "flash":
        flops = 2 * q_len * s * d * heads * b             # causal: half of 4 q s d
        rate_f, rate_b = g.flash_rate(s)
        tail = _causal_tail(heads * b, s, g.sms) / _causal_tail(16 * 16384 // s, s, g.sms)
        at_f, at_b = tail * flops / rate_f, tail * 2.5 * flops / rate_b
    else:                                                 # QK^T and AV per head, then backward
        per = heads * b
        at_f = per * (g.matmul_seconds(q_len, d, s) + g.matmul_seconds(q_len, s, d))
        at_b = per * (g.matmul_seconds(q_len, d, s) + 3 * g.matmul_seconds(q_len, s, d))
        scores = per * q_len * s
        passes = ("residual_add", "layernorm", "dropout") if model.dropout else ("residual_add", "layernorm")
        extra = sum(g.op_seconds(op, scores, dtype_bytes) for op in passes)   # mask, softmax, dropout
        at_f, at_b = at_f + extra / 3, at_b + 2 * extra / 3
    rows = tokens // (t if sequence_parallel else 1)
    mem += 2 * g.op_seconds(model.norm, rows * h, dtype_bytes)
    mem += 2 * g.op_seconds("residual_add", rows * h, dtype_bytes)
    if model.dropout:
        mem += 2 * g.op_seconds("dropout", rows * h, dtype_bytes)
    mem += g.op_seconds("silu_mul" if model.gated_mlp else "gelu",
                        tokens * model.top_k * model.ffn_hidden // t, dtype_bytes)
    mem += 2 * tokens * (model.heads + 2 * model.kv_heads) * d / t * dtype_bytes / g.bandwidth
    mem += 3 * weights * dtype_bytes / g.bandwidth        # grad accumulation (one expert's MLP)
    return {"matmuls": (mm_f, mm_b), "attention": (at_f, at_b), "memory-bound": (mem / 3, 2 * mem / 3)}


def layer_seconds(model: ModelSpec, cluster: Any, tp: int = 1, microbatch: int = 1,
                  **details) -> float:
    """Predicted forward+backward seconds of one tensor-parallel rank's share of one layer of
    ``model`` on one GPU of ``cluster`` (no communication), for ``microbatch`` sequences of
    ``model.seq_len``. ``details``: ``cp``, ``sequence_parallel``, ``attention`` ("flash" by
    default), ``dtype_bytes`` (see ``layer_breakdown``).

    >>> from mtb_helpers.plan import model, cluster
    >>> round(layer_seconds(model("llama3-8b"), cluster("h200"), tp=8) * 1e3, 1)   # ms
    3.9
    """
    return sum(f + b for f, b in layer_breakdown(model, cluster, tp, microbatch, **details).values())
