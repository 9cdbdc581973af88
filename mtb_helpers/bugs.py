"""The deliberate mistakes a check can inject with ``bug=``: {name: one-line description}.

Every check in the package must fail when one of its bugs is injected, on exactly the quantities
the bug breaks; the tests prove it. Names are grouped by the layer that honours them.
"""

BUGS: dict[str, str] = {
    # tensor parallelism (mtb_helpers.tp_bugs): column, row and MLP checks
    "f-backward-identity": "column layer: identity instead of f, so dX is never all-reduced in "
                           "backward (each rank keeps only its partial input grad)",
    "allgather-wrong-order": "column layer with gather_output: the gathered shards are concatenated "
                             "in reverse rank order",
    "bias-before-allreduce": "row layer: every rank adds the full bias before the all-reduce, so "
                             "the output carries t x bias",
    "row-missing-allreduce": "row layer: no all-reduce (g) after the partial products, so each rank "
                             "returns only its partial sum",
    "g-backward-allreduce": "row layer: g also all-reduces in backward, so every grad computed "
                            "before it is t times too large",
}


def validate_bug(bug: str | None, allowed: tuple[str, ...]) -> None:
    """Refuse an unknown bug name (or one this check cannot inject) before any rank starts."""
    if bug is None:
        return
    if bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r}; known bugs: {', '.join(sorted(BUGS))}")
    if bug not in allowed:
        raise ValueError(f"bug {bug!r} does not apply to this check; it can inject: "
                         f"{', '.join(allowed)}")
