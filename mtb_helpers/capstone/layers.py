"""The tiny GPT rebuilt on a rank from the course's parallel layers, and its parameters moved
between the full model and the shards.

Inside one tensor-parallel group of t ranks (``sequence_parallel=True``, Korthikanti et al. 2022):

    ids [s/cp, b] -> VocabParallelEmbedding (rows of W_emb split by vocabulary; g) -> [s/cp, b, h]
                  -> + positions of this context chunk -> split along the sequence -> [s/(cp·t), b, h]
    block:  SP LayerNorm -> all-gather (seq) -> Q,K,V column-split [s/cp, b, 3h/t] -> attention on
            this rank's a/t heads (with cp > 1: ring attention over the context group)
            -> Wo row-split, reduce-scatter (seq) -> [s/(cp·t), b, h] + residual
            -> SequenceParallelMLPBlock (LN, all-gather, fc1, GeLU, fc2, reduce-scatter, residual)
    head:   SP LayerNorm -> all-gather (seq) -> LM head column-split by vocabulary [s/cp, b, vocab/t]
    loss:   vocab_parallel_cross_entropy (all-reduces of [s/cp, b], the max, then [2, s/cp, b]: the
            sum of exponentials and the target logit together), mean over this rank's tokens
    step:   the replicated parameters' partial grads summed once per step (``finalize.py``)

With ``sequence_parallel=False`` the activations stay replicated ``[s/cp, b, h]``, the layers are
the plain tensor-parallel ones (one ``f`` and one ``g`` per attention and per MLP).
"""
from __future__ import annotations

import copy
import functools
from collections import OrderedDict

import torch
from torch import nn

from mtb_helpers.capstone.model import Block, TinyGPT
from mtb_helpers.comm.mesh import group_rank, group_size
from mtb_helpers.comm.regions import scatter_to_sequence_parallel_region
from mtb_helpers.comm.sharding import Replicate, Shard, from_pieces, local_piece, on_mesh
from mtb_helpers.cp.ring import ring_attention
from mtb_helpers.sp.layers import (SequenceParallelColumnLinear, SequenceParallelLayerNorm,
                                   SequenceParallelMLPBlock, SequenceParallelRowLinear,
                                   TensorParallelMLPBlock)
from mtb_helpers.tp.attention import LocalAttention, ParallelSelfAttention, check_heads, grouped_qkv
from mtb_helpers.tp.layers import ColumnParallelLinear, RowParallelLinear
from mtb_helpers.tp.vocab import VocabParallelEmbedding

__all__ = ["ContextParallelCore", "ParallelEmbedding", "ParallelBlock", "ParallelHead",
           "build_stage", "stage_blocks", "param_placement", "replicated_params", "shard_param",
           "gather_param"]


def sequence_layouts(sequence_parallel: bool):
    """The activations between the capstone's layers, ``[s, B, h]`` on the (dp, cp, tp) mesh: batch
    columns by dp, sequence chunks by cp, then under SP each chunk's rows again by tp."""
    return on_mesh(dp=Shard(1), cp=Shard(0), tp=Shard(0) if sequence_parallel else Replicate())


class ContextParallelCore(LocalAttention):
    """This rank's ``a/t`` heads on its sequence chunk; K/V blocks travel the context ring.

    forward: ``qkv [s/cp, b, 3h/t]`` -> ``[b, a/t, s/cp, d]`` x 3 -> ring attention (causal, by
    global position) -> ``[s/cp, b, h/t]``."""
    input_layouts = output_layouts = on_mesh(dp=Shard(1), cp=Shard(0), tp=Shard(-1))

    def __init__(self, n_heads: int, head_dim: int, world_size: int, cp_group):
        super().__init__(n_heads, head_dim, True, world_size)
        self.cp_group = cp_group

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        q, k, v = (self.split_heads(z) for z in qkv.chunk(3, dim=-1))   # 3 x [b, a/t, s/cp, d]
        # [b, a/t, s/cp, d] -> ring over the cp group (K/V passed cp-1 times) -> [b, a/t, s/cp, d]
        ctx = ring_attention(q, k, v, causal=True, layout="contiguous", group=self.cp_group)
        return self.merge_heads(ctx)                                      # -> [s/cp, b, h/t]


class ParallelEmbedding(nn.Module):
    """``ids [s/cp, b]`` (this context chunk) -> ``[s/(cp·t), b, h]`` with sequence parallelism,
    else ``[s/cp, b, h]`` replicated over the tensor group."""
    input_layouts = on_mesh(dp=Shard(1), cp=Shard(0), tp=Replicate())   # ids [s/cp, b/dp]

    def __init__(self, tok: VocabParallelEmbedding, pos: torch.Tensor, sequence_parallel: bool,
                 tp_group, cp_group):
        super().__init__()
        self.tok, self.sequence_parallel, self.tp_group = tok, sequence_parallel, tp_group
        self.register_buffer("pos", pos.clone(), persistent=False)    # [s, h], every position
        self.cp_rank = group_rank(cp_group)
        self.output_layouts = sequence_layouts(sequence_parallel)

    def positions(self, n: int) -> torch.Tensor:
        """The sinusoids of this chunk's global positions ``cp_rank·n .. (cp_rank+1)·n``: ``[n, h]``."""
        return self.pos[self.cp_rank * n:(self.cp_rank + 1) * n]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.positions(ids.shape[0])[:, None, :]   # g inside: [s/cp, b, h]
        if self.sequence_parallel:   # [s/cp, b, h] -> split (seq) -> [s/(cp·t), b, h]
            x = scatter_to_sequence_parallel_region(x, self.tp_group)
        return x


class ParallelBlock(nn.Module):
    """``x = x + attn(ln1(x)); x = mlp_block(x)`` (the MLP block adds its own residual)."""

    def __init__(self, ln1: nn.Module, attn: ParallelSelfAttention, mlp: nn.Module):
        super().__init__()
        self.ln1, self.attn, self.mlp = ln1, attn, mlp
        self.input_layouts = self.output_layouts = sequence_layouts(mlp.input_layouts == Shard(0))

    @classmethod
    def from_full(cls, block: Block, sequence_parallel: bool, tp_group, cp_group) -> "ParallelBlock":
        t, attn = group_size(tp_group), block.attn
        d = check_heads(attn.wq.in_features, attn.heads, t)
        qkv_full = grouped_qkv(attn.wq, attn.wk, attn.wv, t)
        core = (ContextParallelCore(attn.heads, d, t, cp_group) if group_size(cp_group) > 1
                else LocalAttention(attn.heads, d, True, t))
        if sequence_parallel:   # LayerNorm and bias grads: summed once per step (finalize.py)
            ln1 = SequenceParallelLayerNorm.from_full(block.ln1, "ln1", tp_group, grad_sync="step")
            qkv = SequenceParallelColumnLinear.from_full(qkv_full, group=tp_group)
            out = SequenceParallelRowLinear.from_full(attn.wo, group=tp_group, grad_sync="step")
            mlp = SequenceParallelMLPBlock.from_full(block.ln2, block.mlp.fc1, block.mlp.fc2,
                                                     dropout_p=0.0, group=tp_group, grad_sync="step")
        else:
            ln1 = copy.deepcopy(block.ln1)   # replicated: every tensor rank holds all of it
            qkv = ColumnParallelLinear.from_full(qkv_full, group=tp_group)
            out = RowParallelLinear.from_full(attn.wo, input_is_parallel=True, group=tp_group)
            mlp = TensorParallelMLPBlock.from_full(block.ln2, block.mlp.fc1, block.mlp.fc2,
                                                   dropout_p=0.0, group=tp_group)
        return cls(ln1, ParallelSelfAttention(qkv, core, out), mlp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))   # [s/(cp·t), b, h] (SP) or [s/cp, b, h]
        return self.mlp(x)


class ParallelHead(nn.Module):
    """``x -> ln_f -> logits [s/cp, b, vocab/t]`` (this rank's vocabulary columns)."""
    output_layouts = on_mesh(dp=Shard(1), cp=Shard(0), tp=Shard(-1))   # logits [s/cp, b/dp, vocab/t]

    def __init__(self, ln_f: nn.Module, lm_head: ColumnParallelLinear):
        super().__init__()
        self.ln_f, self.lm_head = ln_f, lm_head
        self.input_layouts = sequence_layouts(lm_head.input_layouts == Shard(0))

    @classmethod
    def from_full(cls, head, sequence_parallel: bool, tp_group) -> "ParallelHead":
        if sequence_parallel:   # the gather of the sequence happens inside the LM head
            return cls(SequenceParallelLayerNorm.from_full(head.ln_f, "ln_f", tp_group, grad_sync="step"),
                       SequenceParallelColumnLinear.from_full(head.lm_head, group=tp_group))
        return cls(copy.deepcopy(head.ln_f), ColumnParallelLinear.from_full(head.lm_head,
                                                                             group=tp_group))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # SP: [s/(cp·t), b, h] -> LN -> all-gather (seq) -> [s/cp, b, h] @ [h, vocab/t] -> [s/cp, b, vocab/t]
        return self.lm_head(self.ln_f(x))


def stage_blocks(layers: int, pp: int, stage: int) -> range:
    """The blocks pipeline stage ``stage`` holds: ``L/pp`` consecutive ones."""
    per = layers // pp
    return range(stage * per, (stage + 1) * per)


def build_stage(model: TinyGPT, stage: int, pp: int, sequence_parallel: bool, tp_group, cp_group,
                embedding_cls=ParallelEmbedding) -> nn.Sequential:
    """Pipeline stage ``stage`` of ``model`` as this rank's shards: the embedding on stage 0, its
    ``L/pp`` blocks, the head on the last stage. Parameter names: ``embed.*``, ``block{i}.*``,
    ``head.*``."""
    parts: OrderedDict[str, nn.Module] = OrderedDict()
    if stage == 0:
        tok = VocabParallelEmbedding.from_full(model.embed.tok, group=tp_group)
        parts["embed"] = embedding_cls(tok, model.embed.pos, sequence_parallel, tp_group, cp_group)
    for i in stage_blocks(model.cfg.layers, pp, stage):
        parts[f"block{i}"] = ParallelBlock.from_full(model.blocks[i], sequence_parallel,
                                                     tp_group, cp_group)
    if stage == pp - 1:
        parts["head"] = ParallelHead.from_full(model.head, sequence_parallel, tp_group)
    return nn.Sequential(parts)


# ---- between the full model's parameters and a rank's shards ----------------------------------

# Each stage parameter: its name in the full model and how the tensor-parallel ranks hold it, in
# DTensor's placements (the rows of ``nn.Linear.weight`` are its outputs). A name with ``{}`` is
# the fused Q/K/V of grouped heads: rank r holds rows r of ``wq``, ``wk`` and ``wv`` (each
# ``Shard(0)``), stacked ``[Q_r; K_r; V_r]``.
REPLICATED, ROWS, COLS = Replicate(), Shard(0), Shard(1)
_BLOCK = {"ln1.weight": ("ln1.weight", REPLICATED), "ln1.bias": ("ln1.bias", REPLICATED),
          "attn.qkv.weight": ("attn.w{}.weight", ROWS), "attn.qkv.bias": ("attn.w{}.bias", ROWS),
          "attn.out.weight": ("attn.wo.weight", COLS), "attn.out.bias": ("attn.wo.bias", REPLICATED),
          "mlp.ln.weight": ("ln2.weight", REPLICATED), "mlp.ln.bias": ("ln2.bias", REPLICATED),
          "mlp.fc1.weight": ("mlp.fc1.weight", ROWS), "mlp.fc1.bias": ("mlp.fc1.bias", ROWS),
          "mlp.fc2.weight": ("mlp.fc2.weight", COLS), "mlp.fc2.bias": ("mlp.fc2.bias", REPLICATED)}
_ENDS = {"embed.tok.weight": ("embed.tok.weight", ROWS),
         "head.ln_f.weight": ("head.ln_f.weight", REPLICATED), "head.ln_f.bias": ("head.ln_f.bias", REPLICATED),
         "head.lm_head.weight": ("head.lm_head.weight", ROWS)}


@functools.lru_cache(maxsize=1024)   # a pure function of a name, asked ~150 times a step checked
def param_placement(stage_name: str) -> tuple[str, Replicate | Shard]:
    """``(full name, placement)`` of a stage parameter over the tensor-parallel group."""
    if stage_name in _ENDS:
        return _ENDS[stage_name]
    block, rest = stage_name.split(".", 1)
    rest = rest.replace("mlp.mlp.", "mlp.")   # TensorParallelMLPBlock nests its ParallelMLP
    full, placement = _BLOCK[rest]
    return f"blocks.{int(block[len('block'):])}.{full}", placement


def replicated_params(module: nn.Module) -> list[nn.Parameter]:
    """The stage's ``Replicate()`` parameters (LayerNorms, Wo's and fc2's biases), in module order:
    under sequence parallelism their grads are partial until ``finalize.SequenceParallelGrads``."""
    return [p for name, p in module.named_parameters() if param_placement(name)[1] == REPLICATED]


def shard_param(full: dict[str, torch.Tensor], stage_name: str, t: int, r: int) -> torch.Tensor:
    """Rank ``r``'s (of ``t``) piece of a stage parameter, cut from the full model's tensors."""
    name, placement = param_placement(stage_name)
    if "{}" in name:
        return torch.cat([local_piece(full[name.format(w)], placement, r, t) for w in "qkv"])
    return local_piece(full[name], placement, r, t)


def gather_param(shards: list[torch.Tensor], stage_name: str) -> dict[str, torch.Tensor]:
    """The full tensor(s) from the ``t`` ranks' pieces, in tensor-parallel rank order."""
    name, placement = param_placement(stage_name)
    if "{}" in name:
        parts = [s.chunk(3) for s in shards]    # rank r: [Q_r; K_r; V_r]
        return {name.format(w): from_pieces({r: p[i] for r, p in enumerate(parts)}, placement, len(parts))
                for i, w in enumerate("qkv")}
    if placement == REPLICATED:   # rank 0's copy (a partial grad's pieces differ: no check here)
        return {name: shards[0]}
    return {name: from_pieces(dict(enumerate(shards)), placement, len(shards))}
