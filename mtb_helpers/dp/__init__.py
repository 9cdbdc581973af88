"""Data parallelism: notebook 06's DDP (notebook 14's ``OverlappedDDP`` without overlap, run by
strategies.py's ``FlatStep``), ZeRO-1/2 (strategies.py, stepping notebook 14's ``ShardedOptimizer``)
and ZeRO-3 (fsdp.py: notebook 14's ``FSDP`` with prefetch off), the wrong strategies (bugs.py); and
(notebook 14) the wrappers any training script can use, which hide communication: OverlappedDDP
(overlap.py), ShardedOptimizer (sharded_optimizer.py), FSDP (fsdp_wrapper.py)."""
from mtb_helpers.dp.strategies import (SHARDED, STRATEGIES, Adam, FlatShards, FlatStep, Strategy, ZeRO1,
                                       ZeRO2, flat, held_bytes, make_mlp, padded_numel)
from mtb_helpers.dp.fsdp import STRATEGY_CLASSES, ZeRO3Step, build_strategy
from mtb_helpers.dp.overlap import OverlappedDDP
from mtb_helpers.dp.sharded_optimizer import ShardedOptimizer
from mtb_helpers.dp.fsdp_wrapper import FSDP
from mtb_helpers.dp import bugs  # noqa: F401  registers the topic's bugs (checking/bug.py)

__all__ = ["STRATEGIES", "SHARDED", "Adam", "make_mlp", "flat", "padded_numel", "FlatShards",
           "held_bytes", "Strategy", "FlatStep", "ZeRO1", "ZeRO2", "ZeRO3Step", "STRATEGY_CLASSES",
           "build_strategy", "OverlappedDDP", "ShardedOptimizer", "FSDP"]
