"""Data parallelism (notebook 06): DDP, ZeRO-1/2 (strategies.py), ZeRO-3/FSDP (fsdp.py), the
wrong strategies (bugs.py)."""
from mtb_helpers.dp.strategies import (DDP, SHARDED, STRATEGIES, Adam, Layout, Strategy, ZeRO1,
                                       ZeRO2, flat, held_bytes, make_mlp, padded_numel)
from mtb_helpers.dp.fsdp import STRATEGY_CLASSES, ZeRO3
from mtb_helpers.dp.bugs import build_strategy

__all__ = ["STRATEGIES", "SHARDED", "Adam", "make_mlp", "flat", "padded_numel", "Layout",
           "held_bytes", "Strategy", "DDP", "ZeRO1", "ZeRO2", "ZeRO3", "STRATEGY_CLASSES",
           "build_strategy"]
