"""Deliberately wrong gradient synchronisations on the tp x dp grid, for ``check_grid(bug=...)``.

Each stands in for ``average_gradients`` (grid/layers.py), the one step where the grid's two kinds
of group matter: the bug is marked ``# BUG``. The last one names PyTorch's mesh dimensions the
wrong way round in the comparison of ``grid/pytorch.py``; the comparison must then disagree.
"""
from __future__ import annotations

import torch.distributed as dist

from mtb_helpers.checking.bug import Bug, names_for, register
from mtb_helpers.comm.records import note
from mtb_helpers.grid.layers import DP_REGION, GridGroups, average_gradients, grid_mesh

__all__ = ["BUGS", "GRID_BUGS", "sync_in_tp_group", "sync_nothing", "sync_sum"]


def sync_in_tp_group(params: dict, groups: GridGroups) -> list[int]:
    """grid-dp-allreduce-in-tp-group."""
    tp = len(groups.tp_ranks)
    for param in params.values():
        total = param.grad.clone()
        if tp > 1:
            dist.all_reduce(total, group=groups.tp_group)   # BUG: sums the other shards, not the other replicas
        note("all_reduce", param.grad, total, DP_REGION, "", "backward", tp)
        param.grad.copy_(total / tp)
    return groups.tp_ranks


def sync_nothing(params: dict, groups: GridGroups) -> list[int]:
    """grid-no-dp-allreduce."""
    return groups.dp_ranks   # BUG: each replica keeps the gradient of its own rows


def sync_sum(params: dict, groups: GridGroups) -> list[int]:
    """grid-dp-sum-not-average."""
    dp = len(groups.dp_ranks)
    for param in params.values():
        total = param.grad.clone()
        if dp > 1:
            dist.all_reduce(total, group=groups.dp_group)
        note("all_reduce", param.grad, total, DP_REGION, "", "backward", dp)
        param.grad.copy_(total)   # BUG: the sum of dp means, dp times the gradient of the batch
    return groups.dp_ranks


def grid_mesh_dims_swapped(tp: int, dp: int):
    """mesh-dims-swapped."""
    from torch.distributed.device_mesh import init_device_mesh
    # BUG: the names read ("tp", "dp") on a (dp, tp) mesh: the "tp" group is a column of the grid
    return init_device_mesh("cpu", (dp, tp), mesh_dim_names=("tp", "dp"))


BUGS: dict[str, Bug] = {
    "grid-dp-allreduce-in-tp-group": Bug(
        "grid: the gradient all-reduce runs in the tensor-parallel group, summing different shards "
        "instead of the replicas' grads of the same shard",
        checks=("grid",), replaces={average_gradients: sync_in_tp_group}),
    "grid-no-dp-allreduce": Bug(
        "grid: no gradient all-reduce across the data-parallel group, so each replica steps with the "
        "gradient of its own slice of the batch",
        checks=("grid",), replaces={average_gradients: sync_nothing}),
    "grid-dp-sum-not-average": Bug(
        "grid: the data-parallel all-reduce sums the replicas' gradients without dividing by dp, so "
        "the step is dp times too large",
        checks=("grid",), replaces={average_gradients: sync_sum}),
    "mesh-dims-swapped": Bug(
        "PyTorch's grid: mesh_dim_names=(\"tp\", \"dp\") on a (dp, tp) mesh, so the tensor-parallel "
        "group is a column of the grid",
        checks=("pytorch_grid",), replaces={grid_mesh: grid_mesh_dims_swapped}),
}
GRID_BUGS = names_for(BUGS, "grid")

register("grid", BUGS)   # at import: see checking/bug.py
