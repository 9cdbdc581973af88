"""Tensor parallelism (notebooks 01-03, 10): column- and row-parallel linear layers, the MLP,
attention split by heads, and the vocabulary split (embedding and cross-entropy)."""
from mtb_helpers.comm.sharding import check_divisible, shard_range
from mtb_helpers.tp.attention import ParallelSelfAttention
from mtb_helpers.tp.layers import ColumnParallelLinear, ParallelMLP, RowParallelLinear
from mtb_helpers.tp.vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "ParallelMLP", "check_divisible",
           "shard_range", "ParallelSelfAttention", "VocabParallelEmbedding",
           "vocab_parallel_cross_entropy"]
