"""Tensor parallelism (notebooks 01-03): column- and row-parallel linear layers and the MLP.

Attention split by heads and the vocabulary split (notebook 10) are their own topic,
``mtb_helpers.attention``, built on these layers. The stable entry points
``ParallelSelfAttention``, ``VocabParallelEmbedding`` and ``vocab_parallel_cross_entropy`` stay
importable from here.
"""
from mtb_helpers.comm.sharding import check_divisible, shard_range
from mtb_helpers.tp.layers import ColumnParallelLinear, ParallelMLP, RowParallelLinear
# after tp.layers, which is all the attention topic needs from this package (no circle at runtime)
from mtb_helpers.attention.layers import ParallelSelfAttention  # noqa: E402
from mtb_helpers.attention.vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy  # noqa: E402

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "ParallelMLP", "check_divisible",
           "shard_range", "ParallelSelfAttention", "VocabParallelEmbedding",
           "vocab_parallel_cross_entropy"]
