"""What the planner reasons about: a model (``ModelSpec``), a cluster (``ClusterSpec``) and a way
to lay the model out on it (``Layout``). Plain numbers only: nothing here allocates a tensor, so a
405B-parameter model costs the same microseconds as the capstone's tiny GPT.

Every size is checked when the object is made (``Spec``: a positive integer, a finite positive
number, a known name), and ``layout_problems`` lists, in words, every reason a layout cannot run a model on
a cluster; ``check_layout`` raises a ValueError with them.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, TypeVar

from mtb_helpers.cost.model import one_of, positive, whole

__all__ = ["Spec", "ModelSpec", "ClusterSpec", "Layout", "DTYPE_BYTES", "RECOMPUTE", "SCHEDULES", "ATTENTION",
           "layout_problems", "check_layout", "stage_layers", "tp_problems", "linears"]

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8}
RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("materialized", "flash")     # what attention keeps for backward: ``Layout``'s docstring
SCHEDULES = ("1f1b", "gpipe", "interleaved", "zb-h1")
NORMS = {"layernorm": 2, "rmsnorm": 1}   # parameters per feature: LayerNorm has a weight and a bias


S = TypeVar("S", bound="Spec")


class Spec:
    """A frozen dataclass checked when it is made: every ``int`` field a positive integer, every
    ``float`` a finite positive number, every field named in ``CHOICES`` one of its values, then
    ``_check``'s rules between fields (types are read as strings: each subclass's module has
    ``from __future__ import annotations``). ``with_`` copies it with some fields changed, checked
    again."""
    CHOICES: dict[str, Any] = {}

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in self.CHOICES:
                one_of(f.name, value, self.CHOICES[f.name])
            elif f.type == "int" or (f.type == "int | None" and value is not None):
                whole(f.name, value)
            elif f.type == "float":
                positive(f.name, value)
        self._check()

    def _check(self) -> None:
        """Rules between fields (none unless a subclass has some)."""

    def with_(self: S, **changes) -> S:
        return replace(self, **changes)


@dataclass(frozen=True)
class ModelSpec(Spec):
    """A decoder-only transformer: ``layers`` blocks of width ``hidden`` with ``heads`` query heads
    of ``hidden / heads`` features, ``kv_heads`` key/value heads (grouped-query attention when
    fewer), an MLP of width ``ffn_hidden`` (SwiGLU's three matrices when ``gated_mlp``), a
    vocabulary of ``vocab``, trained on sequences of ``seq_len``. ``experts`` > 1 makes every MLP
    a mixture of experts of which each token uses ``top_k``. ``fused_swiglu``: the gated MLP's
    silu(gate) * up runs as one fused kernel (Megatron-LM's ``bias_swiglu``; what it keeps:
    :mod:`mtb_helpers.plan.memory`)."""
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int
    experts: int = 1
    top_k: int = 1
    gated_mlp: bool = False
    bias: bool = False            # biases on every linear layer except the output layer
    norm: str = "rmsnorm"
    tied_embeddings: bool = False
    learned_positions: bool = False
    dropout: bool = False         # dropout masks are activations too (1 byte per element)
    name: str = ""
    fused_swiglu: bool = False
    CHOICES = {"norm": NORMS}

    def _check(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by heads={self.heads}: "
                             "each head has hidden/heads features")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} is not divisible by kv_heads={self.kv_heads}: "
                             "grouped-query attention shares each K/V head among heads/kv_heads")
        if self.top_k > self.experts:
            raise ValueError(f"top_k={self.top_k} exceeds experts={self.experts}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(frozen=True)
class ClusterSpec(Spec):
    """``nodes`` nodes of ``gpus_per_node`` GPUs, each with ``memory_bytes`` of memory and
    ``peak_flops`` dense 16-bit FLOP/s. ``intra_node`` and ``inter_node`` are
    ``mtb_helpers.cost.Link``s (α seconds per message, β bytes per second per GPU and direction):
    a group whose ranks sit in one node talks over the first, any other over the second.
    ``compute``: a ``mtb_helpers.plan.compute.GPUCompute`` (how fast one GPU runs a layer's
    matmuls, attention and memory-bound operations, fitted to measurements), or None when the
    cluster has none and step times need an efficiency you assume."""
    gpus_per_node: int
    nodes: int
    memory_bytes: float
    peak_flops: float
    intra_node: Any
    inter_node: Any
    name: str = ""
    compute: Any = None

    def _check(self) -> None:
        for f in ("intra_node", "inter_node"):
            link = getattr(self, f)
            if not (hasattr(link, "alpha") and hasattr(link, "bandwidth")):
                raise ValueError(f"{f} must be a Link(alpha, bandwidth), got {link!r}")
        if self.compute is not None and not hasattr(self.compute, "matmul_seconds"):
            raise ValueError(f"compute must be a GPUCompute or None, got {self.compute!r}")

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class Layout(Spec):
    """How the model is split: ``tp`` (tensor), ``pp`` (pipeline), ``dp`` (data), ``cp``
    (context) and ``ep`` (expert; carved out of the data-parallel ranks, Megatron-LM's rule) ranks.
    Each data-parallel replica runs ``grad_accum`` micro-batches of ``microbatch`` sequences per
    step, so the global batch is ``dp * microbatch * grad_accum``. ``schedule`` is a pipeline
    schedule of ``mtb_helpers.pp`` (``chunks`` model chunks per rank when interleaved),
    ``zero_stage`` 0 (DDP) to 3 shards model states over the ``dp * cp`` ranks, ``recompute``
    none / selective / full, ``dtype`` of parameters and activations, ``sequence_parallel``
    (Korthikanti et al. 2022) defaults to on whenever ``tp > 1``, ``attention`` "flash" (a fused
    kernel keeps no scores: what current models train with) or "materialized" (the [a, s, s]
    scores kept, as Korthikanti et al. count them)."""
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    microbatch: int = 1
    grad_accum: int = 1
    schedule: str = "1f1b"
    zero_stage: int = 1
    recompute: str = "none"
    dtype: str = "bf16"
    sequence_parallel: bool | None = None
    chunks: int = 1
    attention: str = "flash"
    CHOICES = {"schedule": SCHEDULES, "zero_stage": (0, 1, 2, 3), "recompute": RECOMPUTE,
               "dtype": DTYPE_BYTES, "attention": ATTENTION}

    def _check(self) -> None:
        if (self.schedule == "interleaved") != (self.chunks > 1):
            raise ValueError(f"chunks={self.chunks} with schedule={self.schedule!r}: the "
                             "interleaved schedule needs chunks >= 2, every other exactly 1")
        if self.sequence_parallel is None:
            object.__setattr__(self, "sequence_parallel", self.tp > 1)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def global_batch(self) -> int:
        return self.dp * self.microbatch * self.grad_accum

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def short(self) -> str:
        """``tp=8 pp=16 dp=64 mb=1 ...``: the dimensions, and the rest only where not default."""
        text = f"tp={self.tp} pp={self.pp} dp={self.dp}"
        for f in fields(self)[3:]:
            v = getattr(self, f.name)
            if f.name == "sequence_parallel" or v == f.default:
                continue
            text += f" {dict(microbatch='mb', grad_accum='m', zero_stage='zero').get(f.name, f.name)}={v}"
        return text


def linears(model: ModelSpec, tp: int) -> list[tuple[int, int, bool]]:
    """(in, out, in the MLP) of each matmul ``[T, in] @ [in, out]`` of one layer on one of ``tp``
    tensor-parallel ranks: Q/K/V, the projection, the MLP's (gate and up when gated) and down
    projection; an MoE layer's MLP rows are one expert's. With ``model.bias`` each has a bias of
    ``out``: split after a column split, whole after a row split (Megatron-LM, ``capstone/layers.py``)."""
    h, d, f, t = model.hidden, model.head_dim, model.ffn_hidden, tp
    up = [(h, f // t, True)] * (2 if model.gated_mlp else 1)
    return [(h, (model.heads + 2 * model.kv_heads) * d // t, False), (model.heads * d // t, h, False),
            *up, (f // t, h, True)]


def stage_layers(layers: int, stages: int) -> list[int] | None:
    """Blocks on each of ``stages`` (virtual) pipeline stages, or None if they do not split.
    Equal when ``stages`` divides ``layers``; otherwise Llama 3's balancing (Dubey et al. 2024,
    sec. 3.3.2: 126 layers on 16 stages, "one Transformer layer less on the first and the last
    stage", which also hold the embedding and the output layer): ``ceil(L/stages)`` everywhere,
    the first and the last stage one fewer, allowed when that makes up the whole remainder."""
    per = -(-layers // stages)
    short = per * stages - layers
    if short == 0:
        return [per] * stages
    if short > 2 or stages < short or per < 2:
        return None
    out = [per] * stages
    for i in range(short):
        out[0 if i == 0 else -1] -= 1
    return out


def tp_problems(model: ModelSpec, tp: int) -> list[str]:
    """The sizes of ``model`` that ``tp`` tensor-parallel ranks cannot split evenly, in words."""
    return [f"{what}={size} is not divisible by tp={tp}: each tensor-parallel rank holds {what}/tp of them"
            for what, size in (("heads", model.heads), ("kv_heads", model.kv_heads),
                               ("ffn_hidden", model.ffn_hidden)) if size % tp]


def layout_problems(model: ModelSpec, cluster: ClusterSpec, layout: Layout,
                    global_batch: int | None = None) -> list[str]:
    """Every reason ``layout`` cannot train ``model`` on ``cluster`` (empty when it can), each a
    sentence naming the sizes, in the order a reader would check them."""
    L, t, p, d, c, e = layout, layout.tp, layout.pp, layout.dp, layout.cp, layout.ep
    out = []
    if L.world_size != cluster.gpus:
        out.append(f"tp*pp*dp*cp = {t}*{p}*{d}*{c} = {L.world_size} ranks, but the cluster has "
                   f"{cluster.gpus} GPUs")
    if t > cluster.gpus_per_node:
        out.append(f"tp={t} exceeds {cluster.gpus_per_node} GPUs per node (tensor parallelism "
                   "talks inside every layer: it stays on the node's fast links)")
    elif cluster.gpus_per_node % t:
        out.append(f"tp={t} does not divide {cluster.gpus_per_node} GPUs per node: a tensor "
                   "group would straddle two nodes")
    out += tp_problems(model, t)
    if stage_layers(model.layers, p * L.chunks) is None:
        out.append(f"layers={model.layers} do not split over pp*chunks = {p}*{L.chunks} stages "
                   "(equal stages, or the first and last one layer lighter)")
    if model.seq_len % c:
        out.append(f"seq_len={model.seq_len} is not divisible by cp={c}: each context-parallel "
                   "rank holds seq_len/cp positions")
    elif L.sequence_parallel and (model.seq_len // c) % t:
        out.append(f"seq_len/cp = {model.seq_len // c} is not divisible by tp={t}: sequence "
                   "parallelism splits each context chunk over the tensor group")
    if L.sequence_parallel and t == 1:
        out.append("sequence_parallel needs tp > 1 (it splits the sequence over the tensor group)")
    if e > 1 and model.experts == 1:
        out.append(f"ep={e} needs a mixture-of-experts model (experts=1)")
    elif model.experts % e:
        out.append(f"experts={model.experts} is not divisible by ep={e}: each expert-parallel "
                   "rank holds experts/ep of them")
    if d % e:
        out.append(f"ep={e} does not divide dp={d}: expert-parallel groups are carved out of the "
                   "data-parallel ranks (Megatron-LM)")
    if global_batch is not None and L.global_batch != global_batch:
        out.append(f"dp*microbatch*grad_accum = {d}*{L.microbatch}*{L.grad_accum} = "
                   f"{L.global_batch} sequences, not the global batch {global_batch}")
    if L.schedule == "interleaved" and L.grad_accum % p:
        out.append(f"interleaved needs the micro-batches per step ({L.grad_accum}) divisible by "
                   f"pp={p} (Megatron-LM)")
    if p > 1 and L.zero_stage >= 2:
        out.append(f"zero_stage={L.zero_stage} with pp={p}: ZeRO-2/3 shard the gradients that "
                   "pipeline micro-batches accumulate (DeepSpeed's pipeline engine refuses it)")
    return out


def check_layout(model: ModelSpec, cluster: ClusterSpec, layout: Layout,
                 global_batch: int | None = None) -> None:
    """Raise ValueError naming every constraint ``layout`` breaks (see ``layout_problems``)."""
    problems = layout_problems(model, cluster, layout, global_batch)
    if problems:
        raise ValueError(f"layout {layout.short()} cannot run {model.name or 'the model'} on "
                         f"{cluster.name or 'the cluster'}: " + "; ".join(problems))
