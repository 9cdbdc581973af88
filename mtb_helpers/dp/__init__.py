"""Data parallelism (notebook 06): DDP, ZeRO-1/2 (strategies.py) and ZeRO-3/FSDP (zero3.py)."""
from mtb_helpers.dp.strategies import (DDP, SHARDED, STRATEGIES, Adam, Layout, Strategy, ZeRO1,
                                       ZeRO2, flat, held_bytes, make_mlp, padded_numel)
from mtb_helpers.dp.zero3 import STRATEGY_CLASSES, ZeRO3, build_strategy

__all__ = ["STRATEGIES", "SHARDED", "Adam", "make_mlp", "flat", "padded_numel", "Layout",
           "held_bytes", "Strategy", "DDP", "ZeRO1", "ZeRO2", "ZeRO3", "STRATEGY_CLASSES",
           "build_strategy"]
