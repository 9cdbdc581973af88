"""Tensor x data parallelism on one grid of ranks (notebook 08). A rank's coordinates on it are
``comm.mesh.Mesh(dp=dp, tp=tp)``'s."""
from mtb_helpers.grid.layers import (CONVENTION, DP_REGION, PARAMS, GridGroups, average_gradients,
                                     destroy_groups, dp_group_ranks, expected_bytes, grid_step_on_rank,
                                     make_groups, param_piece, tp_group_ranks, validate_grid)
from mtb_helpers.grid import bugs  # noqa: F401  registers the topic's bugs (checking/bug.py)

__all__ = ["CONVENTION", "DP_REGION", "PARAMS", "GridGroups", "validate_grid", "tp_group_ranks",
           "dp_group_ranks", "make_groups", "destroy_groups", "average_gradients", "grid_step_on_rank",
           "expected_bytes", "param_piece"]
