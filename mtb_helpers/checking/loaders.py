"""Work deferred until the bug registry (bug.py) is first read, kept apart so that handing it over
costs nothing: ``import mtb_helpers`` registers the manifest's bug list here without importing
bug.py's dataclasses (nor, of course, the topics and torch that registering them imports)."""
from __future__ import annotations

from typing import Callable

__all__ = ["load_before_lookup", "run_loaders"]

_LOADERS: list[Callable[[], object]] = []   # to run once, before the registry is first read
_LOADING: list[Callable[[], object]] = []   # the loaders running now


def load_before_lookup(loader: Callable[[], object]) -> None:
    """Run ``loader`` (which registers bugs) before the bug registry is first read."""
    _LOADERS.append(loader)


def run_loaders() -> None:
    """Run the loaders not run yet. A loader is forgotten only once it succeeded (a refusal, e.g.
    a bug name two topics declare, is raised again at the next lookup); one that looks a name up
    itself is not re-entered."""
    for loader in [f for f in _LOADERS if f not in _LOADING]:
        _LOADING.append(loader)
        try:
            loader()
            _LOADERS.remove(loader)
        finally:
            _LOADING.remove(loader)
