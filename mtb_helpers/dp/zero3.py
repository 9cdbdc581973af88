"""ZeRO stage 3 / FSDP, and where notebook 06 imports the deliberate mistakes from.

The strategy itself lives in :mod:`mtb_helpers.dp.fsdp`; the wrong strategies in
:mod:`mtb_helpers.dp.bugs`. This module keeps the names the notebook imports in one place.
"""
from mtb_helpers.dp.bugs import (BUGS_BY_STRATEGY, DP_BUGS, DoubleAverage, GradsNotCleared,
                                 StaleParams, SumNotAverage, build_strategy)
from mtb_helpers.dp.fsdp import STRATEGY_CLASSES, ZeRO3, _ShardedLinear

__all__ = ["ZeRO3", "STRATEGY_CLASSES", "DP_BUGS", "BUGS_BY_STRATEGY", "DoubleAverage",
           "SumNotAverage", "StaleParams", "GradsNotCleared", "build_strategy", "_ShardedLinear"]
