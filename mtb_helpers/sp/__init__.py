"""Sequence parallelism (notebook 04): LayerNorm and dropout on sequence shards."""
from mtb_helpers.sp.layers import (PositionKeyedDropout, SequenceParallelColumnLinear,
                                   SequenceParallelLayerNorm, SequenceParallelMLPBlock,
                                   SequenceParallelRowLinear, TensorParallelMLPBlock, keep_mask,
                                   layernorm_dropout_on_shard, layernorm_dropout_reference,
                                   position_keyed_dropout)
from mtb_helpers.sp import bugs  # noqa: F401  registers the topic's bugs (checking/bug.py)

__all__ = ["keep_mask", "position_keyed_dropout", "PositionKeyedDropout",
           "SequenceParallelLayerNorm", "SequenceParallelColumnLinear", "SequenceParallelRowLinear",
           "SequenceParallelMLPBlock", "TensorParallelMLPBlock", "layernorm_dropout_on_shard",
           "layernorm_dropout_reference"]
