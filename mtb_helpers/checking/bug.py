"""The one shape of a deliberate mistake, shared by every topic's ``bugs.py``.

A bug is the correct piece with one thing wrong: usually a subclass of a correct layer that
overrides one method (marked ``# BUG``), so the correct layers carry no test-only code path and a
notebook can show the wrong code with ``inspect.getsource``. Each topic's ``bugs.py`` holds
``BUGS: dict[str, Bug]``; :mod:`mtb_helpers.checking.bugs` gathers them into the course's registry.

    Bug(description="row layer: every rank adds the full bias before the all-reduce ...",
        checks=("row", "mlp"),                                   # the checks that can inject it
        replaces={RowParallelLinear: RowBiasBeforeAllReduce})    # correct piece -> wrong piece

A check asks for the piece it is about to build with ``swap(bug, RowParallelLinear)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Bug", "swap", "names_for"]


@dataclass(frozen=True)
class Bug:
    """One deliberate mistake: what it breaks (``description``), the checks that accept it
    (``checks``), and the wrong piece that stands in for each correct one (``replaces``)."""
    description: str
    checks: tuple[str, ...]
    replaces: dict[Any, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        if not self.checks:
            raise ValueError("a Bug must name at least one check that can inject it")


def swap(bug: Bug | None, correct: Any) -> Any:
    """The piece to build: the wrong one if ``bug`` replaces ``correct``, else ``correct``."""
    if bug is None:
        return correct
    return bug.replaces.get(correct, correct)


def names_for(registry: dict[str, Bug], check: str) -> tuple[str, ...]:
    """The names in ``registry`` whose bug check ``check`` can inject."""
    return tuple(name for name, bug in registry.items() if check in bug.checks)
