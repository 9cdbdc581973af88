"""Context parallelism (notebook 11): the sequence split across ranks inside attention.

Shards are ``[b, heads, s/cp, d]``, cut by ``shard_sequence(x, cp, r, layout, dim=2)``; ring
attention passes K/V blocks around the ranks, all-gather attention gathers them at once."""
from mtb_helpers.cp.allgather import AllGatherAttention, allgather_attention
from mtb_helpers.cp.base import ContextParallelAttention
from mtb_helpers.cp.online import finish, merge_partials, online_softmax_rows, online_update
from mtb_helpers.cp.ring import RingAttention, ring_attention
from mtb_helpers.cp.sharding import (LAYOUTS, check_sequence, chunk_ids, shard_positions,
                                     shard_sequence, unshard_sequence)
from mtb_helpers.cp import bugs  # noqa: F401  registers the topic's bugs (checking/bug.py)

__all__ = ["shard_sequence", "unshard_sequence", "shard_positions", "chunk_ids", "check_sequence",
           "LAYOUTS", "ring_attention", "allgather_attention", "RingAttention",
           "AllGatherAttention", "ContextParallelAttention", "online_update", "finish",
           "merge_partials", "online_softmax_rows"]
