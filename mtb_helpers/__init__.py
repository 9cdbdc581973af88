"""MiniTrainBench helpers: run notebook code on real gloo ranks and check it against one process.

The stable entry points are re-exported here::

    from mtb_helpers import run, shutdown, RankError, RankTimeoutError, BUGS, seed_all
"""
from mtb_helpers.runtime.ranks import (MAX_WORLD_SIZE, RankError, RankTimeoutError, run, seed_all,
                               shutdown, warm_up)
from mtb_helpers.topics import bug_registry

# {name: one-line description} of every deliberate bug a check's ``bug=`` can inject, from the
# bug modules the manifest (topics.py) names; building it registers each topic's bugs once.
BUGS: dict[str, str] = {name: bug.description for name, bug in bug_registry().items()}

__all__ = ["run", "shutdown", "warm_up", "seed_all", "RankError", "RankTimeoutError", "BUGS",
           "MAX_WORLD_SIZE"]
