"""Measure your GPU for the planner: matmuls, memory-bound ops, FlashAttention, and whole layers
(their saved activations and forward+backward time), then print the planner's predictions beside
them and write a file the planner takes as a cluster.

    python benchmarks/gpu_layer.py --out my_gpu.json            # a CUDA GPU, a few minutes
    python benchmarks/gpu_layer.py --tiny --out tiny.json       # CPU dry run, small shapes, seconds

    from mtb_helpers.plan import cluster, layer_seconds, model
    layer_seconds(model("llama3-8b"), cluster("my_gpu.json"), tp=8)

What it measures (notebook 15, "Against a real GPU", shows the H200's):
  gemm          (M x K) @ (K x N) for M 1k-16k, K and N 512-16k: the matmul curve's rows
  memory-bound  forward+backward of LayerNorm, RMSNorm, GeLU, SiLU·x, residual add, dropout
  attention     SDPA's FlashAttention (causal, head dim 128) forward and forward+backward
  layer         one layer of GPT-3 175B's shape (s 2048) and of Llama 3 8B's (s 2048, 8192), with
                FlashAttention and with materialized scores: the bytes its autograd graph keeps
                (the saved tensors themselves, counted by storage, parameters left out) and ms
  shard         one tensor-parallel rank's share of a layer (a/t heads, f/t MLP, the full hidden
                size in and out) for t = 1, 2, 4, 8 and micro-batches 1, 2, 4: ms, no communication
The file holds every row, the GPU's memory, its dense 16-bit peak (``--peak-tflops``, else the
datasheet's for H100/H200/A100, else the best measured matmul) and memory bandwidth
(``--bandwidth-tbs``, else the datasheet's, else a measured copy's).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from mtb_helpers.plan import ModelSpec, model
from mtb_helpers.plan.gpu_check import against_measurements, gap_table

# (peak dense 16-bit FLOP/s, memory bandwidth B/s) from NVIDIA's datasheets, by device name
DATASHEETS = {"H200": (989e12, 4.8e12), "H100": (989e12, 3.35e12), "A100": (312e12, 2.039e12)}


class Block(nn.Module):
    """One tensor-parallel rank's share of a decoder layer of ``spec`` (``tp = 1``: the layer):
    a/t query heads, kv/t K/V heads, f/t MLP width, the full hidden size in and out."""

    def __init__(self, spec: ModelSpec, tp: int = 1):
        super().__init__()
        h, d = spec.hidden, spec.head_dim
        self.a, self.kv, self.d, self.f = spec.heads // tp, spec.kv_heads // tp, d, spec.ffn_hidden // tp
        norm = nn.RMSNorm if spec.norm == "rmsnorm" else nn.LayerNorm
        self.n1, self.n2 = norm(h), norm(h)
        self.qkv = nn.Linear(h, (self.a + 2 * self.kv) * d, bias=spec.bias)
        self.proj = nn.Linear(self.a * d, h, bias=spec.bias)
        self.up = nn.Linear(h, self.f, bias=spec.bias)
        self.gate = nn.Linear(h, self.f, bias=False) if spec.gated_mlp else None
        self.down = nn.Linear(self.f, h, bias=spec.bias)
        self.p = 0.1 if spec.dropout else 0.0

    def forward(self, x: torch.Tensor, backend: SDPBackend) -> torch.Tensor:   # x: [b, s, h]
        b, s, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).split([self.a * self.d, self.kv * self.d, self.kv * self.d], -1)
        q, k, v = (y.view(b, s, -1, self.d).transpose(1, 2) for y in (q, k, v))
        with sdpa_kernel(backend):
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p, is_causal=True,
                                               enable_gqa=self.kv != self.a)
        x = x + F.dropout(self.proj(y.transpose(1, 2).reshape(b, s, -1)), self.p)
        z = self.n2(x)
        hidden = F.silu(self.gate(z)) * self.up(z) if self.gate is not None else F.gelu(self.up(z))
        return x + F.dropout(self.down(hidden), self.p)


class Bench:
    def __init__(self, device: str, dtype: torch.dtype, reps: int):
        self.device, self.dtype, self.reps = device, dtype, reps

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def seconds(self, fn, reps: int | None = None) -> float:
        """Mean seconds of ``fn()`` after 2 warm-ups."""
        for _ in range(2):
            fn()
        self.sync()
        start = time.perf_counter()
        for _ in range(reps or self.reps):
            fn()
        self.sync()
        return (time.perf_counter() - start) / (reps or self.reps)

    def randn(self, *shape, grad: bool = False) -> torch.Tensor:
        return torch.randn(*shape, device=self.device, dtype=self.dtype, requires_grad=grad)


def saved_bytes(block: Block, x: torch.Tensor, backend: SDPBackend, recompute: bool) -> int:
    """Bytes of the distinct storages the forward saves for backward, parameters left out."""
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = (checkpoint(block, x, backend, use_reentrant=False) if recompute
               else block(x, backend))
    del out
    return sum(seen.values())


def layer_rows(bench: Bench, cases, flash: SDPBackend) -> list[dict]:
    rows = []
    for case, spec, recompute_too in cases:
        for backend in (flash, SDPBackend.MATH):
            for recompute in ((False, True) if recompute_too and backend == flash else (False,)):
                try:
                    torch.manual_seed(0)
                    block = Block(spec).to(bench.device, bench.dtype)
                    x = bench.randn(1, spec.seq_len, spec.hidden, grad=True)
                    saved = saved_bytes(block, x, backend, recompute)

                    def step():
                        y = checkpoint(block, x, backend, use_reentrant=False) if recompute else block(x, backend)
                        y.float().sum().backward()
                    fwd = bench.seconds(lambda: block(x, backend).detach())
                    rows.append(dict(case=f"{case} layer", model=spec.__dict__, s=spec.seq_len, b=1,
                                     attention="flash_attention" if backend == flash else "math",
                                     recompute=recompute, saved_bytes_per_layer=saved,
                                     input_counted=1, dtype_bytes=x.element_size(),
                                     ms_fwd=fwd * 1e3, ms_fwd_bwd=bench.seconds(step) * 1e3))
                except RuntimeError as e:        # out of memory, no kernel for it: the rest still run
                    rows.append(dict(case=f"{case} layer", s=spec.seq_len, error=repr(e)[:200]))
                finally:
                    block = x = None
                    if bench.device == "cuda":
                        torch.cuda.empty_cache()
    return rows


def shard_ms(bench: Bench, spec: ModelSpec, t: int, b: int, flash: SDPBackend) -> float:
    """Forward+backward milliseconds of one rank's share (``t`` ranks) of one layer."""
    torch.manual_seed(0)
    block = Block(spec, t).to(bench.device, bench.dtype)
    x = bench.randn(b, spec.seq_len, spec.hidden, grad=True)
    return bench.seconds(lambda: block(x, flash).float().sum().backward()) * 1e3


def shard_rows(bench: Bench, cases, flash: SDPBackend) -> list[dict]:
    rows = []
    for case, spec, tps, batches in cases:
        for t in tps:
            for b in batches:
                rows.append(dict(case=case, model=spec.__dict__, s=spec.seq_len, t=t, b=b,
                                 attention="flash_attention", ms_fwd_bwd=shard_ms(bench, spec, t, b, flash),
                                 dtype_bytes=torch.finfo(bench.dtype).bits // 8))
    return rows


def gemm_rows(bench: Bench, ms, nks) -> list[dict]:
    rows = []
    for m in ms:
        for k in nks:
            for n in nks:
                a, w = bench.randn(m, k), bench.randn(k, n)
                rows.append(dict(case="gemm", M=m, K=k, N=n, us=bench.seconds(lambda: a @ w) * 1e6))
    return rows


OPS = {"layernorm": lambda x, w: F.layer_norm(x, x.shape[-1:], w),
       "rmsnorm": lambda x, w: F.rms_norm(x, x.shape[-1:], w),
       "gelu": lambda x, w: F.gelu(x), "silu_mul": lambda x, w: F.silu(x) * x,
       "residual_add": lambda x, w: x + x, "dropout": lambda x, w: F.dropout(x, 0.1)}


def memory_bound_rows(bench: Bench, tokens, widths) -> list[dict]:
    rows = []
    for t in tokens:
        for h in widths:
            x, w, g = bench.randn(t, h, grad=True), bench.randn(h, grad=True), bench.randn(t, h)
            for op, fn in OPS.items():
                us = bench.seconds(lambda: fn(x, w).backward(g)) * 1e6
                rows.append(dict(case="memory-bound", op=op, tokens=t, h=h, us_fwd_bwd=us))
    return rows


def attention_rows(bench: Bench, seqs, heads: int, flash: SDPBackend) -> list[dict]:
    rows = []
    for s in seqs:
        q, k, v = (bench.randn(1, heads, s, 128, grad=True) for _ in range(3))
        with sdpa_kernel(flash):
            fwd = bench.seconds(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).detach())
            both = bench.seconds(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward())
        rows.append(dict(case="attention", s=s, heads=heads, head_dim=128, batch=1,
                         us_fwd=fwd * 1e6, us_fwd_bwd=both * 1e6))
    return rows


def machine(bench: Bench, rows: list[dict], args) -> dict:
    """Device name, memory, peak and bandwidth: given, else the datasheet's, else measured."""
    if bench.device == "cuda":
        name, memory = torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).total_memory
    else:
        name, memory = "cpu", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    sheet = next((v for k, v in DATASHEETS.items() if k in name), None)
    best = max(2 * r["M"] * r["K"] * r["N"] / (r["us"] * 1e-6) for r in rows if r["case"] == "gemm")
    x = bench.randn(1 << (26 if bench.device == "cuda" else 22))
    copy = 2 * x.numel() * x.element_size() / bench.seconds(lambda: x.clone())
    peak = args.peak_tflops * 1e12 if args.peak_tflops else (sheet[0] if sheet else best)
    bw = args.bandwidth_tbs * 1e12 if args.bandwidth_tbs else (sheet[1] if sheet else copy)
    return dict(device=name, memory_bytes=memory, peak_flops=peak, bandwidth=bw,
                best_matmul_flops=best, copy_bandwidth=copy)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="the JSON file to write (cluster(path) reads it)")
    p.add_argument("--tiny", action="store_true", help="CPU dry run with small shapes (float32)")
    p.add_argument("--peak-tflops", type=float, default=None, help="dense 16-bit peak TFLOP/s")
    p.add_argument("--bandwidth-tbs", type=float, default=None, help="memory bandwidth, TB/s")
    args = p.parse_args(argv)
    if not args.tiny and not torch.cuda.is_available():
        p.error("no CUDA GPU here: run with --tiny for the CPU dry run")
    folder = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(folder):
        p.error(f"--out {args.out}: no folder {folder} to write it in")
    for flag, v in (("--peak-tflops", args.peak_tflops), ("--bandwidth-tbs", args.bandwidth_tbs)):
        if v is not None and not v > 0:
            p.error(f"{flag} must be > 0, got {v}")
    bench = Bench("cpu", torch.float32, 2) if args.tiny else Bench("cuda", torch.bfloat16, 10)
    flash = SDPBackend.FLASH_ATTENTION
    if args.tiny:
        # no dropout: PyTorch's CPU FlashAttention has none
        gpt = ModelSpec(layers=1, hidden=128, heads=4, kv_heads=4, ffn_hidden=512, vocab=64, seq_len=64,
                        bias=True, norm="layernorm", name="tiny-gpt")
        llama = ModelSpec(layers=1, hidden=128, heads=4, kv_heads=2, ffn_hidden=384, vocab=64,
                          seq_len=128, gated_mlp=True, name="tiny-llama")
        layers = [("tiny-gpt", gpt, True), ("tiny-llama", llama, False)]
        shards = [("tiny-llama", llama, (1, 2), (1,))]
        # K from 128 to 2048, so that even a busy CPU shows the products growing with K
        sizes = dict(ms=(128,), nks=(128, 512, 2048), tokens=(256,), widths=(128,), seqs=(128,), heads=4)
    else:
        gpt, l8 = model("gpt3-175b"), model("llama3-8b")
        layers = [("gpt3-175b", gpt, True), ("llama3-8b", l8.with_(seq_len=2048), False),
                  ("llama3-8b", l8, False)]
        shards = [("llama3-8b", l8, (1, 2, 4, 8), (1,)), ("gpt3-175b", gpt.with_(dropout=False), (1, 2, 4, 8), (1,)),
                  ("llama3-8b", l8, (8,), (2, 4)), ("gpt3-175b", gpt.with_(dropout=False), (8,), (2, 4))]
        sizes = dict(ms=(1024, 2048, 4096, 8192, 16384), nks=(512, 1024, 2048, 4096, 8192, 16384),
                     tokens=(8192, 16384), widths=(4096, 8192, 12288, 14336), seqs=(2048, 8192), heads=32)
    rows = gemm_rows(bench, sizes["ms"], sizes["nks"])
    rows += memory_bound_rows(bench, sizes["tokens"], sizes["widths"])
    rows += attention_rows(bench, sizes["seqs"], sizes["heads"], flash)
    rows += layer_rows(bench, layers, flash)
    rows += shard_rows(bench, shards, flash)
    doc = dict(machine(bench, rows, args), torch=torch.__version__, date=time.strftime("%Y-%m-%d"),
               dtype_bytes=torch.finfo(bench.dtype).bits // 8, tiny=args.tiny,
               script="benchmarks/gpu_layer.py", rows=rows)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"{doc['device']}, torch {doc['torch']}: {len(rows)} rows written to {args.out}")
    print(gap_table(against_measurements(args.out, materialized=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
