"""Tensor parallelism (notebooks 01-03): column- and row-parallel linear layers and the MLP.

Attention split by heads and the vocabulary split (notebook 10) are their own topic,
``mtb_helpers.attention``, built on these layers. The stable entry points
``ParallelSelfAttention``, ``VocabParallelEmbedding`` and ``vocab_parallel_cross_entropy`` stay
importable from here.
"""
import importlib

from mtb_helpers.comm.sharding import check_divisible, shard_range
from mtb_helpers.tp.layers import ColumnParallelLinear, ParallelMLP, RowParallelLinear

# Loaded on first use (PEP 562): the attention topic imports tp.layers, which runs this file
# first, so importing attention here would find it half-loaded when attention is imported first.
_FROM_ATTENTION = {"ParallelSelfAttention": "mtb_helpers.attention.layers",
                   "VocabParallelEmbedding": "mtb_helpers.attention.vocab",
                   "vocab_parallel_cross_entropy": "mtb_helpers.attention.vocab"}


def __getattr__(name: str):
    if name in _FROM_ATTENTION:
        return getattr(importlib.import_module(_FROM_ATTENTION[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_FROM_ATTENTION])


__all__ = ["ColumnParallelLinear", "RowParallelLinear", "ParallelMLP", "check_divisible",
           "shard_range", "ParallelSelfAttention", "VocabParallelEmbedding",
           "vocab_parallel_cross_entropy"]
