"""The one shape of a deliberate mistake, shared by every topic's ``bugs.py``.

A bug is the correct piece with one thing wrong: usually a subclass of a correct layer that
overrides one method (marked ``# BUG``), so the correct layers carry no test-only code path and a
notebook can show the wrong code with ``inspect.getsource``. Each topic's ``bugs.py`` holds
``BUGS: dict[str, Bug]``; the manifest (:mod:`mtb_helpers.topics`) registers each topic's bugs
here under the topic's name, and a name two topics declare is refused at import, naming both.

    Bug(description="row layer: every rank adds the full bias before the all-reduce ...",
        checks=("row", "mlp"),                                   # the checks that can inject it
        replaces={RowParallelLinear: RowBiasBeforeAllReduce})    # correct piece -> wrong piece

A check resolves the name it was given once, against its own topic's registry, with
``resolve(BUGS, name, "row")`` (a ValueError before any rank starts for an unknown name or one
this check cannot inject), then asks for the piece it is about to build with
``swap(bug, RowParallelLinear)``. This module knows no topic: topics register into it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Bug", "swap", "names_for", "register", "resolve", "registered"]

# every registered bug name -> the topic that declared it (filled by mtb_helpers.topics)
_OWNERS: dict[str, str] = {}


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


def register(topic: str, bugs: dict[str, Bug]) -> None:
    """Note that ``topic`` declares ``bugs``; a name another topic already declared is refused
    (registering the same topic again, e.g. on a module reload, is harmless)."""
    for name in bugs:
        owner = _OWNERS.get(name, topic)
        if owner != topic:
            raise ValueError(f"bug name {name!r} is declared by two topics, {owner!r} and "
                             f"{topic!r}: rename one of them")
    _OWNERS.update(dict.fromkeys(bugs, topic))


def registered() -> dict[str, str]:
    """{bug name: topic} of every registered bug."""
    return dict(_OWNERS)


def resolve(registry: dict[str, Bug], name: str | None,
            check: str | tuple[str, ...]) -> Bug | None:
    """The ``Bug`` called ``name`` in a topic's ``registry`` (None for no bug), refusing with a
    ValueError an unknown name or one that check ``check`` cannot inject. ``check`` is the check's
    name (its ``Bug.checks`` entry) or the tuple of names it accepts."""
    if name is None:
        return None
    allowed = names_for(registry, check) if isinstance(check, str) else tuple(check)
    if name in allowed:
        return registry[name]
    if name not in _OWNERS and name not in registry:
        raise ValueError(f"unknown bug {name!r}; known bugs: {', '.join(sorted(_OWNERS))}")
    raise ValueError(f"bug {name!r} does not apply to this check; it can inject: "
                     f"{', '.join(allowed) or 'no bug'}")
