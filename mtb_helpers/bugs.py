"""The deliberate mistakes a check can inject with ``bug=``: {name: one-line description}.

Every check in the package must fail when one of its bugs is injected, on exactly the quantities
the bug breaks; the tests prove it. Names are grouped by the layer that honours them.
"""

BUGS: dict[str, str] = {}


def validate_bug(bug: str | None, allowed: tuple[str, ...]) -> None:
    """Refuse an unknown bug name (or one this check cannot inject) before any rank starts."""
    if bug is None:
        return
    if bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r}; known bugs: {', '.join(sorted(BUGS))}")
    if bug not in allowed:
        raise ValueError(f"bug {bug!r} does not apply to this check; it can inject: "
                         f"{', '.join(allowed)}")
