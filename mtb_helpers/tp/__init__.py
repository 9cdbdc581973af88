"""Tensor parallelism (notebooks 01-03): column- and row-parallel linear layers and the MLP."""
from mtb_helpers.comm.sharding import check_divisible, shard_range
from mtb_helpers.tp.layers import ColumnParallelLinear, ParallelMLP, RowParallelLinear

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "ParallelMLP", "check_divisible",
           "shard_range"]
