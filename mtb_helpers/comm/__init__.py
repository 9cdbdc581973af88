"""Communication: every autograd region (tensor- and sequence-parallel), the record of what each
rank sent, and how a dimension is cut into shards. Layers import from here; nothing here imports a
topic, a check, a plot or a widget."""
from mtb_helpers.comm.records import CollectiveEvent, CollectiveRecord, record
from mtb_helpers.comm.regions import (allreduce_grad, copy_to_tensor_model_parallel_region,
                                      gather_from_tensor_model_parallel_region, group_rank,
                                      group_size, issue, reduce_from_tensor_model_parallel_region,
                                      scatter_to_tensor_model_parallel_region)
from mtb_helpers.comm.sharding import check_divisible, shard_range
from mtb_helpers.comm.sp_regions import (allreduce_sequence_parallel_grad,
                                         gather_from_sequence_parallel_region,
                                         reduce_scatter_to_sequence_parallel_region,
                                         scatter_to_sequence_parallel_region)

__all__ = ["CollectiveEvent", "CollectiveRecord", "record", "issue", "group_size", "group_rank",
           "allreduce_grad", "check_divisible", "shard_range",
           "copy_to_tensor_model_parallel_region", "reduce_from_tensor_model_parallel_region",
           "gather_from_tensor_model_parallel_region", "scatter_to_tensor_model_parallel_region",
           "scatter_to_sequence_parallel_region", "gather_from_sequence_parallel_region",
           "reduce_scatter_to_sequence_parallel_region", "allreduce_sequence_parallel_grad"]
