"""MiniTrainBench helpers: run notebook code on real gloo ranks and check it against one process.

The stable entry points are re-exported here::

    from mtb_helpers import run, shutdown, RankError, RankTimeoutError, BUGS, seed_all

They load on first use (PEP 562): ``import mtb_helpers`` imports no torch, so the
``minitrainbench`` command is handling Ctrl-C before the 1-5 s of importing torch start (a
traceback otherwise), and a kernel that only asks for ``run`` loads no topic (nor
``torch.distributed.tensor``, which the topics' layouts need).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:   # what the names below are, for readers and type checkers
    from mtb_helpers.runtime.ranks import (MAX_WORLD_SIZE, RankError, RankTimeoutError, run,
                                           seed_all, shutdown, warm_up)

    BUGS: dict[str, str]

__all__ = ["run", "shutdown", "warm_up", "seed_all", "RankError", "RankTimeoutError", "BUGS",
           "MAX_WORLD_SIZE"]


def __getattr__(name: str) -> Any:
    if name == "BUGS":
        # {name: one-line description} of every deliberate bug a check's ``bug=`` can inject,
        # gathered by the manifest from every topic's bug modules
        from mtb_helpers.topics import bug_registry
        value = {bug_name: bug.description for bug_name, bug in bug_registry().items()}
    elif name in __all__:   # the others are runtime.ranks's
        from mtb_helpers.runtime import ranks
        value = getattr(ranks, name)
    else:
        raise AttributeError(f"module 'mtb_helpers' has no attribute {name!r}")
    globals()[name] = value   # loaded once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
