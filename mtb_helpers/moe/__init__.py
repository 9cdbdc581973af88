"""Expert parallelism (notebook 07): routing, dispatch and combine with all-to-all."""
from mtb_helpers.moe.layers import (COMBINE, COUNTS, DISPATCH, ROUTER_GRAD, Expert,
                                    ExpertParallelMoE, Routing, all_to_all_rows, expert_capacity,
                                    inverse_permutation, capacity_mask, moe_reference, route)
from mtb_helpers.moe import bugs  # noqa: F401  registers the topic's bugs (checking/bug.py)

__all__ = ["Expert", "route", "expert_capacity", "capacity_mask", "inverse_permutation",
           "all_to_all_rows", "moe_reference", "ExpertParallelMoE",
           "Routing", "COUNTS", "DISPATCH", "COMBINE", "ROUTER_GRAD"]
