"""The deliberate mistakes a check can inject with ``bug=``: {name: one-line description}.

Every check in the package must fail when one of its bugs is injected, on exactly the quantities
the bug breaks; the tests prove it. Names are grouped by the layer that honours them.
"""
from __future__ import annotations

from mtb_helpers.checking.bug import Bug, names_for
from mtb_helpers.collectives import bugs as collectives_bugs
from mtb_helpers.cp import bugs as cp_bugs
from mtb_helpers.dp import bugs as dp_bugs
from mtb_helpers.grid import bugs as grid_bugs
from mtb_helpers.moe import bugs as moe_bugs
from mtb_helpers.pp import bugs as pp_bugs
from mtb_helpers.sp import bugs as sp_bugs
from mtb_helpers.tp import bugs as tp_bugs
from mtb_helpers.tp import attention_bugs as tp_attention_bugs
from mtb_helpers.capstone import bugs as capstone_bugs

BUGS: dict[str, str] = {
}


# Topics that declare their mistakes in the one shape (``BUGS: dict[str, Bug]`` in their bugs.py)
# are gathered here; a new topic adds its module to this tuple.
TOPIC_REGISTRIES: tuple[dict[str, Bug], ...] = (
    collectives_bugs.BUGS,
    tp_bugs.BUGS,
    tp_attention_bugs.BUGS,
    sp_bugs.BUGS,
    moe_bugs.BUGS,
    pp_bugs.BUGS,
    grid_bugs.BUGS,
    dp_bugs.BUGS,
    cp_bugs.BUGS,
    capstone_bugs.BUGS,
)
REGISTRY: dict[str, Bug] = {name: bug for registry in TOPIC_REGISTRIES
                            for name, bug in registry.items()}
BUGS.update({name: bug.description for name, bug in REGISTRY.items()})


def bugs_for(check: str) -> tuple[str, ...]:
    """The names of the registered bugs that check ``check`` can inject."""
    return names_for(REGISTRY, check)


def validate_bug(bug: str | None, allowed: tuple[str, ...] | str) -> Bug | None:
    """Refuse an unknown bug name (or one this check cannot inject) before any rank starts.

    ``allowed`` is the tuple of names the check accepts, or the check's name (then the registry
    says which bugs apply). Returns the registered ``Bug`` (None for no bug or an older topic)."""
    if bug is None:
        return None
    if isinstance(allowed, str):
        allowed = bugs_for(allowed)
    if bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r}; known bugs: {', '.join(sorted(BUGS))}")
    if bug not in allowed:
        raise ValueError(f"bug {bug!r} does not apply to this check; it can inject: "
                         f"{', '.join(allowed)}")
    return REGISTRY.get(bug)
