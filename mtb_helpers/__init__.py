"""MiniTrainBench helpers: run notebook code on real gloo ranks and check it against one process.

The stable entry points (see DESIGN.md) are re-exported here::

    from mtb_helpers import run, shutdown, RankError, RankTimeoutError, BUGS, seed_all
"""
from mtb_helpers.runtime.ranks import (MAX_WORLD_SIZE, RankError, RankTimeoutError, run, seed_all,
                               shutdown, warm_up)
from mtb_helpers.checking.bugs import BUGS

__all__ = ["run", "shutdown", "warm_up", "seed_all", "RankError", "RankTimeoutError", "BUGS",
           "MAX_WORLD_SIZE"]
