"""Published models and clusters, each figure with its source.

    from mtb_helpers.plan.presets import model, cluster
    model("llama3-8b"), cluster("h100", gpus=64)

Models (sizes as their papers and released configurations state them):

  gpt3-175b     Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1: 96 layers,
                d_model 12288, 96 heads of 128, context 2048; the MLP is 4 x d_model (the GPT-2
                architecture the paper says it keeps), GPT-2's BPE vocabulary of 50257, learned
                positions, LayerNorm with biases, input and output embeddings tied.
  llama3-8b, llama3-70b, llama3-405b
                Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3: layers 32 / 80 / 126,
                model dimension 4096 / 8192 / 16384, FFN 14336 / 28672 / 53248, heads 32 / 64 /
                128, 8 key/value heads, SwiGLU, RMSNorm, RoPE, no biases, untied embeddings. The
                table rounds the vocabulary to 128,000; the released config.json files say 128256
                (128000 tokens + 256 reserved), which the parameter counts (8.03B, 70.6B, 405.9B)
                need. Sequence length 8192 (the paper's sec. 3.4.1 pre-training length).
  mixtral-8x7b  Jiang et al. 2024, "Mixtral of Experts", Table 1: dim 4096, 32 layers, head_dim
                128, 32 heads, 8 kv heads, hidden_dim 14336, vocab 32000, 8 experts, top-2,
                context 32768 (46.7B parameters, 12.9B used per token).
  tiny-gpt      The capstone's model (``mtb_helpers.capstone.model.GPTConfig``'s defaults): a
                LayerNorm GPT with biases, GeLU MLP, sinusoidal positions (not parameters) and an
                untied LM head without bias.

Clusters:

  h100          NVIDIA DGX H100 nodes: 8 H100 SXM5 80 GB (NVIDIA H100 Tensor Core GPU datasheet:
                989 TFLOP/s dense BF16, 3.35 TB/s HBM3), NVLink 4 at 900 GB/s per GPU both ways
                together (450 GB/s each way) through NVSwitch, and one 400 Gb/s ConnectX-7
                InfiniBand NDR port per GPU (50 GB/s each way) between nodes (DGX H100 user
                guide). Latencies: a few microseconds per NCCL message inside a node, ~10 us
                across (the order nccl-tests reports for small all-reduces); these two are
                assumptions, stated as such.
  h200          NVIDIA DGX H200 nodes: 8 H200 SXM 141 GB (NVIDIA H200 Tensor Core GPU datasheet:
                989 TFLOP/s dense BF16, 4.8 TB/s HBM3e), NVLink and InfiniBand as the H100 nodes.
                Its compute curve (``compute.h200_compute``) is fitted to the H200 measured here
                (``measured/``).
  a100          NVIDIA DGX A100 nodes (the machines of Narayanan et al. 2021): 8 A100 SXM4 80 GB,
                312 TFLOP/s dense BF16 (A100 datasheet), NVLink 3 at 600 GB/s per GPU both ways
                (300 GB/s each way), eight 200 Gb/s HDR InfiniBand ports (25 GB/s per GPU each way).

The H100 preset uses the H200's compute curve with the H100's 3.35 TB/s for the memory-bound
operations: an assumption (the two share the GH100 compute die and its 989 TFLOP/s; not measured
on an H100). The A100 preset has no compute curve: step times on it need an efficiency.
``cluster("path/to/measurement.json")`` makes a cluster of the GPU ``benchmarks/gpu_layer.py``
measured: its memory, its peak, its compute curve, the H100 nodes' links.

GPU memory is counted in GiB (2**30 bytes), as the command line's ``--gpu-memory 80`` reads it.
"""
from __future__ import annotations

from pathlib import Path

from mtb_helpers.capstone.model import GPTConfig
from mtb_helpers.cost import Link
from mtb_helpers.cost.model import positive, whole
from mtb_helpers.plan.compute import h200_compute, measurement
from mtb_helpers.plan.specs import ClusterSpec, ModelSpec

__all__ = ["MODELS", "CLUSTERS", "model", "cluster", "cluster_from_measurement", "tiny_gpt", "GIB"]

GIB = 2 ** 30

_LLAMA = dict(kv_heads=8, vocab=128256, seq_len=8192, gated_mlp=True, norm="rmsnorm")


def tiny_gpt(cfg: GPTConfig = GPTConfig()) -> ModelSpec:
    """The capstone's GPT as a ModelSpec: the same sizes as ``cfg`` (its defaults unless given)."""
    return ModelSpec(layers=cfg.layers, hidden=cfg.hidden, heads=cfg.heads, kv_heads=cfg.heads,
                     ffn_hidden=cfg.ffn, vocab=cfg.vocab, seq_len=cfg.seq, bias=True,
                     norm="layernorm", name="tiny-gpt")


MODELS: dict[str, ModelSpec] = {
    "gpt3-175b": ModelSpec(layers=96, hidden=12288, heads=96, kv_heads=96, ffn_hidden=4 * 12288,
                           vocab=50257, seq_len=2048, bias=True, norm="layernorm",
                           tied_embeddings=True, learned_positions=True, dropout=True,
                           name="gpt3-175b"),
    **{name: ModelSpec(layers=layers, hidden=hidden, heads=heads, ffn_hidden=ffn, **_LLAMA, name=name)
       for name, layers, hidden, heads, ffn in (("llama3-8b", 32, 4096, 32, 14336),
                                                ("llama3-70b", 80, 8192, 64, 28672),
                                                ("llama3-405b", 126, 16384, 128, 53248))},
    "mixtral-8x7b": ModelSpec(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                              vocab=32000, seq_len=32768, experts=8, top_k=2, gated_mlp=True,
                              norm="rmsnorm", name="mixtral-8x7b"),
    "tiny-gpt": tiny_gpt(),
}

_NVLINK4, _NDR = Link(alpha=3e-6, bandwidth=450e9), Link(alpha=10e-6, bandwidth=50e9)
# Per GPU: (memory, dense 16-bit FLOP/s, intra-node Link, inter-node Link, compute curve or None:
# a function, so that the measurements are read when first used), 8 GPUs per node.
_CLUSTERS = {
    "h100": (80 * GIB, 989e12, _NVLINK4, _NDR, lambda: h200_compute().with_bandwidth(3.35e12, "H100")),
    "h200": (141e9, 989e12, _NVLINK4, _NDR, h200_compute),
    "a100": (80 * GIB, 312e12, Link(alpha=3e-6, bandwidth=300e9), Link(alpha=10e-6, bandwidth=25e9),
             lambda: None),
}
CLUSTERS = tuple(_CLUSTERS)


def model(name: str) -> ModelSpec:
    """The preset called ``name`` (see ``MODELS``); ValueError naming the known ones otherwise."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; presets: {', '.join(MODELS)}")
    return MODELS[name]


def cluster(name: str = "h100", gpus: int = 8, memory_gib: float | None = None,
            gpus_per_node: int = 8) -> ClusterSpec:
    """``gpus`` GPUs of the preset ``name`` in nodes of ``gpus_per_node`` (fewer GPUs than a node:
    one partly used node). ``memory_gib`` overrides the GPU memory. ``name`` may also be the path
    of a ``.json`` file ``benchmarks/gpu_layer.py`` wrote (``cluster_from_measurement``)."""
    if name not in _CLUSTERS and str(name).endswith(".json"):
        return cluster_from_measurement(name, gpus, memory_gib, gpus_per_node)
    if name not in _CLUSTERS:
        raise ValueError(f"unknown cluster {name!r}; presets: {', '.join(_CLUSTERS)}, or the path "
                         "of a .json file benchmarks/gpu_layer.py wrote")
    memory, flops, intra, inter, compute = _CLUSTERS[name]
    return _nodes(name.upper(), memory, flops, intra, inter, compute(), gpus, memory_gib,
                  gpus_per_node)


def cluster_from_measurement(path: str | Path, gpus: int = 8, memory_gib: float | None = None,
                             gpus_per_node: int = 8) -> ClusterSpec:
    """A cluster of the GPU measured in ``path`` (``benchmarks/gpu_layer.py --out path``): its
    memory, dense 16-bit peak and compute curve (``compute.fit_compute`` on its rows), in nodes
    linked as the H100 preset's (NVLink 4 inside, InfiniBand NDR across: an assumption)."""
    doc, compute = measurement(path)
    memory = positive(f"memory_bytes in {str(path)!r}", doc.get("memory_bytes"))
    return _nodes(str(doc["device"]), memory, doc["peak_flops"], _NVLINK4, _NDR, compute, gpus,
                  memory_gib, gpus_per_node)


def _nodes(label: str, memory: float, flops: float, intra, inter, compute, gpus: int,
           memory_gib: float | None, gpus_per_node: int) -> ClusterSpec:
    whole("gpus", gpus)
    whole("gpus_per_node", gpus_per_node)
    if memory_gib is not None:
        memory = positive("memory_gib", memory_gib) * GIB
    per_node = min(gpus, gpus_per_node)
    if gpus % per_node:
        raise ValueError(f"gpus={gpus} is not a whole number of {per_node}-GPU nodes")
    return ClusterSpec(per_node, gpus // per_node, memory, flops, intra, inter,
                       name=f"{gpus} x {label}", compute=compute)
