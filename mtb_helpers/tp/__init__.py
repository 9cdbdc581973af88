"""Tensor parallelism (notebooks 01-03 and 10): column/row-parallel layers and what they build.

The column- and row-parallel linear layers and the MLP (``layers.py``), attention split by heads
(``attention.py``) and the vocabulary split at both ends (``vocab.py``), both built on them.
"""
from mtb_helpers.comm.sharding import check_divisible, shard_range
from mtb_helpers.tp.attention import ParallelSelfAttention
from mtb_helpers.tp.layers import ColumnParallelLinear, ParallelMLP, RowParallelLinear
from mtb_helpers.tp.vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy
from mtb_helpers.tp import attention_bugs, bugs  # noqa: F401  registers the topic's bugs (checking/bug.py)

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "ParallelMLP", "check_divisible",
           "shard_range", "ParallelSelfAttention", "VocabParallelEmbedding",
           "vocab_parallel_cross_entropy"]
