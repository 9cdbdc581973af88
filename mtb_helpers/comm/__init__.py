"""Communication: the autograd regions of tensor and sequence parallelism (``regions.py``, one
Function each, calling ``torch.distributed``), the record of what each rank sent (observed from
below; ``records.note`` names a call made outside a region), the groups of a mesh, and how a
dimension is cut into shards. Layers import from here; nothing here imports a topic, a
check, a plot or a widget."""
from mtb_helpers.comm.mesh import group_rank, group_size
from mtb_helpers.comm.records import CollectiveEvent, CollectiveRecord, record, recorded
from mtb_helpers.comm.regions import (REGIONS, allreduce_grad, allreduce_sequence_parallel_grad,
                                      copy_to_tensor_model_parallel_region,
                                      gather_from_sequence_parallel_region,
                                      gather_from_tensor_model_parallel_region,
                                      reduce_from_tensor_model_parallel_region,
                                      reduce_scatter_to_sequence_parallel_region,
                                      scatter_to_sequence_parallel_region,
                                      scatter_to_tensor_model_parallel_region)
from mtb_helpers.comm.sharding import check_divisible, shard_range

__all__ = ["CollectiveEvent", "CollectiveRecord", "record", "recorded", "group_size", "group_rank",
           "allreduce_grad", "check_divisible", "shard_range", "REGIONS",
           "copy_to_tensor_model_parallel_region", "reduce_from_tensor_model_parallel_region",
           "gather_from_tensor_model_parallel_region", "scatter_to_tensor_model_parallel_region",
           "scatter_to_sequence_parallel_region", "gather_from_sequence_parallel_region",
           "reduce_scatter_to_sequence_parallel_region", "allreduce_sequence_parallel_grad"]
