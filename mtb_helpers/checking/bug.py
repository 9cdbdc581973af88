"""The one shape of a deliberate bug, and the one registry every check resolves names in.

A bug is the correct piece with one thing wrong: usually a subclass of a correct layer that
overrides one method (marked ``# BUG``), so the correct layers carry no test-only code path and a
notebook can show the wrong code with ``inspect.getsource``. Each topic's bug modules hold
``BUGS: dict[str, Bug]`` and register them here at import (``register("tp", BUGS)``, their last
line); each topic's package imports its bug modules, so whatever module of a topic is loaded, its
bugs are registered. This module imports no topic: ``mtb_helpers.BUGS`` (the manifest,
:mod:`mtb_helpers.topics`) imports every topic's bugs to list them all.

    Bug("row layer: every rank adds the full bias before the all-reduce ...",   # what it breaks
        checks=("row", "mlp"),                                 # the checks that can inject it
        replaces={RowParallelLinear: RowBiasBeforeAllReduce},  # correct piece -> wrong piece
        needs={"2 or more ranks": lambda a: a["world_size"] >= 2})   # else it cannot show

An entry point (a check, ``pipeline_step``, a PyTorch comparison) resolves the bug's name once,
before any rank starts: ``bug = resolve(name, "row", world_size=t)``, then builds
``swap(bug, RowParallelLinear)``. A ``Bug`` sent to the ranks travels as its name and is looked up
again there, so its wrong pieces need not be picklable: the rank function's module, unpickled
first, is in a topic, so the rank has imported that topic's bugs before it reads the name.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["Bug", "Setting", "swap", "names_for", "register", "resolve", "registered", "showing"]

_REGISTRY: dict[str, "Bug"] = {}   # every registered name -> its Bug (each bug module registers)
_OWNERS: dict[str, str] = {}       # every registered name -> the topic that declared it


def _registered_bug(name: str) -> "Bug":
    """A pickled ``Bug``, unpickled on a rank: the same registry entry there."""
    if name not in _REGISTRY:
        raise LookupError(f"bug {name!r} is not registered in this process: import its topic "
                          "(e.g. the module of the function the ranks run) before unpickling it")
    return _REGISTRY[name]


@dataclass(frozen=True)
class Setting:
    """A need that the check's argument ``arg`` is ``value`` (``Bug.needs``), one a front end (a
    command, an explorer) meets for the user by setting it (``showing``): choosing the bug is
    enough there, and a direct call with another value is still refused."""
    arg: str
    value: Any

    def __call__(self, args: dict) -> bool:
        return args[self.arg] == self.value


@dataclass(frozen=True)
class Bug:
    """One deliberate bug: what it breaks (``description``), the checks that accept it
    (``checks``), the wrong piece that stands in for each correct one (``replaces``), and what it
    needs to show at all (``needs``: {condition in words: test on the check's arguments})."""
    description: str
    checks: tuple[str, ...]
    replaces: dict[Any, Any] = field(default_factory=dict, hash=False, compare=False)
    needs: dict[str, Callable[[dict], bool]] = field(default_factory=dict, hash=False,
                                                     compare=False)

    def __post_init__(self) -> None:
        if not self.checks:
            raise ValueError("a Bug must name at least one check that can inject it")

    def unmet(self, **args: Any) -> list[str]:
        """The conditions of ``needs`` the check's arguments ``args`` do not meet (a condition on
        an argument the caller did not pass is left to the check that does)."""
        unmet = []
        for text, holds in self.needs.items():
            try:
                if not holds(args):
                    unmet.append(text)
            except KeyError:
                continue
        return unmet

    def __reduce__(self):
        name = next((n for n, b in _REGISTRY.items() if b is self), None)
        if name is None:
            raise TypeError(f"only a registered Bug can be sent to the ranks: {self.description}")
        return _registered_bug, (name,)


def swap(bug: Bug | None, correct: Any) -> Any:
    """The piece to build: the wrong one if ``bug`` replaces ``correct``, else ``correct``.

    ``replaces`` names a correct piece by the object itself, or by its dotted path
    (``"mtb_helpers.dp.pytorch.torch_model"``) where the bugs' module must not import it: a PyTorch
    comparison imported with a topic's bugs would have every notebook's ranks preload DTensor or
    pipelining (``HEAVY_RANK_IMPORTS``, runtime/start.py)."""
    if bug is None:
        return correct
    if correct in bug.replaces:
        return bug.replaces[correct]
    return bug.replaces.get(f"{correct.__module__}.{correct.__qualname__}", correct)


def names_for(registry: dict[str, Bug], check: str, **args: Any) -> tuple[str, ...]:
    """The names in ``registry`` whose bug check ``check`` can inject and, given some of the
    check's arguments ``args``, can show under them (those ``resolve`` would not refuse)."""
    return tuple(n for n, bug in registry.items() if check in bug.checks and not bug.unmet(**args))


def register(topic: str, bugs: dict[str, Bug]) -> None:
    """Note that ``topic`` declares ``bugs``; a name another topic already declared is refused
    (registering the same topic again, e.g. on a module reload, replaces its entries)."""
    for name in bugs:
        owner = _OWNERS.get(name, topic)
        if owner != topic:
            raise ValueError(f"bug name {name!r} is declared by two topics, {owner!r} and "
                             f"{topic!r}: rename one of them")
    _OWNERS.update(dict.fromkeys(bugs, topic))
    _REGISTRY.update(bugs)


def registered() -> dict[str, Bug]:
    """{name: Bug} of every bug registered so far (the topics imported in this process)."""
    return dict(_REGISTRY)


def resolve(name: str | None, check: str | tuple[str, ...], **args: Any) -> Bug | None:
    """The registered ``Bug`` called ``name`` (None for no bug), or a ValueError (raised before
    any rank starts) for an unknown name, a bug that check ``check`` (a name, or several the
    caller accepts) cannot inject, or a check's arguments ``args`` the bug cannot show under."""
    if name is None:
        return None
    checks = (check,) if isinstance(check, str) else tuple(check)
    bug = _REGISTRY.get(name)
    allowed = ", ".join(n for n, b in _REGISTRY.items() if set(checks) & set(b.checks))
    if bug is None:
        raise ValueError(f"unknown bug {name!r}; this check can inject: {allowed or 'no bug'}")
    if not set(checks) & set(bug.checks):
        raise ValueError(f"bug {name!r} does not apply to this check; it can inject: "
                         f"{allowed or 'no bug'}")
    if unmet := bug.unmet(**args):
        given = ", ".join(f"{k}={v!r}" for k, v in args.items())
        raise ValueError(f"bug {name!r} cannot show here: it needs {'; '.join(unmet)} "
                         f"(given {given})")
    return bug


def showing(name: str | None, args: dict[str, Any]) -> dict[str, Any]:
    """A front end's ``args`` for a check, with the arguments bug ``name`` needs set (its
    ``Setting`` needs) put in; unchanged for no bug or a name ``resolve`` will refuse anyway."""
    needs = _REGISTRY[name].needs.values() if name in _REGISTRY else ()
    return {**args, **{need.arg: need.value for need in needs if isinstance(need, Setting)}}
