"""Attention split by heads and the vocabulary split at both ends (notebook 10).

``layers.py``: ``ParallelSelfAttention`` (Q, K, V column-parallel by whole heads, Wo row-parallel:
one ``f``, one ``g``); ``vocab.py``: ``VocabParallelEmbedding`` and ``vocab_parallel_cross_entropy``
(rows of the table and columns of the logits split by vocabulary range). Both build on the
column- and row-parallel layers of ``mtb_helpers.tp``; ``from mtb_helpers.tp import
ParallelSelfAttention, VocabParallelEmbedding, vocab_parallel_cross_entropy`` keeps working.
"""
from mtb_helpers.attention.layers import (LocalAttention, ParallelSelfAttention, check_heads,
                                          grouped_qkv)
from mtb_helpers.attention.vocab import (REDUCTIONS, VocabParallelCrossEntropy,
                                         VocabParallelEmbedding, vocab_parallel_cross_entropy)

__all__ = ["ParallelSelfAttention", "LocalAttention", "check_heads", "grouped_qkv",
           "VocabParallelEmbedding", "VocabParallelCrossEntropy", "vocab_parallel_cross_entropy",
           "REDUCTIONS"]
