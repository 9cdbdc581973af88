"""The deliberate mistakes a check can inject with ``bug=``: {name: one-line description}.

Every check in the package must fail when one of its bugs is injected, on exactly the quantities
the bug breaks; the tests prove it. Names are grouped by the layer that honours them.
"""
from __future__ import annotations

from mtb_helpers.checking.bug import Bug

BUGS: dict[str, str] = {
    # the collectives primer (mtb_helpers.collectives.ops): check_collectives
    "broadcast-wrong-root": "broadcast: src is the last rank instead of rank 0, so every rank gets "
                            "the last rank's buffer",
    "allreduce-lost-inplace": "all-reduce: reduces a temporary copy (all_reduce works in place) and "
                              "returns the untouched input",
    "allgather-rank-order": "all-gather: shards concatenated in ring arrival order (own shard "
                            "first) instead of by source rank",
    "reduce-scatter-wrong-chunk": "reduce-scatter: rank r keeps chunk r+1 of the sum (off by one)",
    "alltoall-wrong-split": "all-to-all: splits along the wrong dimension, element i goes to rank "
                            "i mod t instead of chunk i // (n/t)",
    # tensor parallelism (mtb_helpers.tp.bugs): column, row and MLP checks
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
    # sequence parallelism (mtb_helpers.sp.bugs): check_sequence_parallel
    "sp-no-layernorm-grad-allreduce": "sequence-parallel LayerNorm: weight and bias grads are not "
                                      "all-reduced, so each rank keeps the grad of its own tokens",
    "sp-same-dropout-mask": "sequence-parallel dropout: the mask is keyed by local positions, so "
                            "every sequence shard drops the same elements",
    "sp-allreduce-instead-of-reduce-scatter": "sequence-parallel fc2: all-reduce (g) of the whole "
                                              "sequence, then each rank slices its rows; forward "
                                              "is right, backward never all-gathers dZ",
    # data parallelism (mtb_helpers.dp.zero3): check_data_parallel, every strategy unless noted
    "dp-double-average": "data parallel: the reduced gradient is divided by t twice (e.g. the "
                         "loss already divided by t, then averaged again), t times too small",
    "dp-sum-not-average": "data parallel: the gradient is summed over ranks and never divided "
                          "by t, t times the whole batch's gradient",
    "zero-stale-params": "ZeRO-1/2: no all-gather of the parameters after the sharded Adam step, "
                         "so every rank's copy is updated only in its own shard",
    # tensor x data parallelism on a grid (mtb_helpers.grid.check): check_grid
    "grid-dp-allreduce-in-tp-group": "grid: the gradient all-reduce runs in the tensor-parallel "
                                     "group, summing different shards instead of the replicas' "
                                     "grads of the same shard",
    "grid-no-dp-allreduce": "grid: no gradient all-reduce across the data-parallel group, so each "
                            "replica steps with the gradient of its own slice of the batch",
    "grid-dp-sum-not-average": "grid: the data-parallel all-reduce sums the replicas' gradients "
                               "without dividing by dp, so the step is dp times too large",
    # expert parallelism (mtb_helpers.moe.bugs): check_moe
    "moe-no-inverse-permutation": "MoE combine: the rows coming back from the experts stay sorted "
                                  "by expert instead of going back to their tokens",
    "moe-gate-not-applied": "MoE combine: expert outputs are summed without the router "
                            "probabilities, so the router gets no gradient",
    "moe-no-router-grad-allreduce": "MoE router: its grad is not all-reduced, so each rank keeps "
                                    "the router grad of its own tokens",
}


# Topics that declare their mistakes in the one shape (``BUGS: dict[str, Bug]`` in their bugs.py)
# are gathered here; a new topic adds its module to this tuple.
TOPIC_REGISTRIES: tuple[dict[str, Bug], ...] = ()
REGISTRY: dict[str, Bug] = {name: bug for registry in TOPIC_REGISTRIES
                            for name, bug in registry.items()}
BUGS.update({name: bug.description for name, bug in REGISTRY.items()})


def bugs_for(check: str) -> tuple[str, ...]:
    """The names of the registered bugs that check ``check`` can inject."""
    return tuple(name for name, bug in REGISTRY.items() if check in bug.checks)


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
