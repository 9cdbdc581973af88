"""Tensor x data parallelism on one grid of ranks: the groups, and one training step on it.

``world_size = tp * dp`` ranks form a grid of ``dp`` rows (data-parallel replicas) by ``tp``
columns (tensor-parallel shards). We number them the way Megatron-LM does (with no pipeline or
context dimension): **tensor-parallel ranks are neighbours**,

    rank = dp_index * tp + tp_index        e.g. tp = 2, dp = 2:   replica 0: ranks 0 1
                                                                  replica 1: ranks 2 3

so a tensor-parallel group is a row ``[d*tp, ..., d*tp + tp-1]`` and a data-parallel group a
column ``[j, j + tp, j + 2tp, ...]``: tensor parallelism talks inside every layer, data parallelism
once per step, so the chatty group gets the neighbouring ranks, which a launcher places on one node
(Shoeybi et al. 2019; Narayanan et al., SC 2021). It is ``comm.mesh``'s ``Mesh(dp=dp, tp=tp)``,
numbered as ``init_device_mesh("cpu", (dp, tp))`` does.

The step (``grid_step_on_rank``): notebook 03's TP MLP in this rank's TP group on its replica's
rows ``[b/dp, h]``, MSE loss, backward (``g`` and ``f`` all-reduce in the TP group), each grad shard
averaged over the DP group (``average_gradients``), one SGD step. Each recorded event is tagged
with the ranks of the group it ran in.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mtb_helpers.comm.mesh import Mesh, MeshGroups
from mtb_helpers.comm.records import note, record
from mtb_helpers.comm.sharding import Replicate, Shard, local_piece, shard_range
from mtb_helpers.tp.layers import ParallelMLP

__all__ = ["CONVENTION", "DP_REGION", "PARAMS", "GridGroups", "validate_grid", "tp_group_ranks",
           "dp_group_ranks", "make_groups", "destroy_groups", "average_gradients", "grid_step_on_rank",
           "expected_bytes", "param_piece", "grid_mesh"]

CONVENTION = "rank = dp_index * tp + tp_index (Megatron-LM: tensor-parallel ranks are neighbours)"
DP_REGION = "data_parallel_grad_allreduce"
# how the tensor-parallel ranks hold each parameter (nn.Linear layout): fc1 by rows, fc2 by columns
PLACEMENTS = {"fc1.weight": Shard(0), "fc1.bias": Shard(0), "fc2.weight": Shard(1), "fc2.bias": Replicate()}
PARAMS = tuple(PLACEMENTS)


def validate_grid(world_size: int, tp: int, dp: int) -> None:
    """ValueError unless ``tp`` and ``dp`` are positive integers with ``tp * dp == world_size``."""
    Mesh(tp=tp, dp=dp)   # refuses a size that is not a positive integer, naming it
    if tp * dp != world_size:
        raise ValueError(f"a grid of tp={tp} x dp={dp} = {tp * dp} ranks does not match the "
                         f"world size {world_size}: every rank must sit in exactly one cell")


def tp_group_ranks(tp: int, dp: int) -> list[list[int]]:
    """The tensor-parallel groups, one per replica: ``[[0, .., tp-1], [tp, .., 2tp-1], ...]``."""
    return Mesh(dp=dp, tp=tp).group_ranks("tp")


def dp_group_ranks(tp: int, dp: int) -> list[list[int]]:
    """The data-parallel groups, one per shard: ``[[0, tp, 2tp, ..], [1, tp+1, ..], ...]``."""
    return Mesh(dp=dp, tp=tp).group_ranks("dp")


@dataclass
class GridGroups:
    """This rank's place on the grid and the two subgroups it belongs to."""
    tp_index: int
    dp_index: int
    tp_ranks: list[int]
    dp_ranks: list[int]
    tp_group: object
    dp_group: object
    created: list          # every group this rank created, to destroy them after the step


def make_groups(tp: int, dp: int) -> GridGroups:
    """On every rank: the ``Mesh(dp=dp, tp=tp)`` and its groups, every DP group and every TP
    group created in the same order on all ranks (``new_group`` is collective: a rank that
    skipped a group it is not in would hang the others)."""
    validate_grid(dist.get_world_size(), tp, dp)
    mesh = MeshGroups.build(Mesh(dp=dp, tp=tp))
    return GridGroups(mesh.index["tp"], mesh.index["dp"], mesh.members["tp"], mesh.members["dp"],
                      mesh.groups["tp"], mesh.groups["dp"], mesh.created)


def destroy_groups(groups: GridGroups) -> None:
    """Free the subgroups (the rank pool is reused, so every step would otherwise leak some)."""
    for group in groups.created:
        dist.destroy_process_group(group)


def average_gradients(params: dict[str, nn.Parameter], groups: GridGroups) -> list[int]:
    """DP: all-reduce each local grad shard over this rank's **data-parallel** group and divide by
    its size, so every replica ends with the gradient of the whole batch. Returns the ranks of the
    group used (for the record). One all-reduce per parameter shard, in ``PARAMS`` order."""
    dp = len(groups.dp_ranks)
    for param in params.values():
        total = param.grad.clone()   # this replica's grad shard
        if dp > 1:   # one replica: nothing to sum (still named in the record, 0 B sent)
            dist.all_reduce(total, group=groups.dp_group)   # -> the sum of the dp replicas' shards
        note("all_reduce", param.grad, total, DP_REGION, "", "backward", dp)
        param.grad.copy_(total / dp)
    return groups.dp_ranks


def param_piece(name: str, full: torch.Tensor, tp: int, tp_index: int) -> torch.Tensor:
    """The piece of full parameter ``name`` (nn.Linear layout) that shard ``tp_index`` holds:
    fc1 rows (``[ffn/tp, h]``, ``[ffn/tp]``), fc2 columns (``[h, ffn/tp]``), fc2's bias whole."""
    return local_piece(full, PLACEMENTS[name], tp_index, tp)


def grid_step_on_rank(fc1: nn.Linear, fc2: nn.Linear, x: torch.Tensor, target: torch.Tensor,
                      tp: int, dp: int, lr: float,
                      sync: Callable[[dict, GridGroups], list[int]] = average_gradients) -> dict:
    """Run on every rank: one SGD step of ``MSE(mlp(x), target)`` on the ``tp x dp`` grid.

    ``x``, ``target``: the full batch ``[b, h]`` (every rank gets it; it keeps its replica's rows
    ``[b/dp, h]``); ``fc1``, ``fc2``: the full layers. Returns this rank's coordinates and groups,
    ``output`` ``[b/dp, h]``, ``loss`` (of its rows), ``grads`` and ``params`` (after the step)
    per parameter shard, the collective ``record`` and ``event_groups`` (the ranks of the group
    each recorded event ran in).
    """
    groups = make_groups(tp, dp)
    try:
        mlp = ParallelMLP.from_full(fc1, fc2, group=groups.tp_group)
        params = dict(mlp.named_parameters())
        lo, hi = shard_range(x.shape[0], dp, groups.dp_index)
        # x requires grad as inside a model (the layer below needs dX), so f's backward runs
        x_local = x[lo:hi].clone().requires_grad_(True)   # [b, h] -> this replica's [b/dp, h]
        with record() as rec:
            y = mlp(x_local)                  # [b/dp, h] -> [b/dp, h]; g: all-reduce in the TP group
            loss = F.mse_loss(y, target[lo:hi])        # mean over this replica's rows
            loss.backward()                            # f: all-reduce of dX in the TP group
            n_tp_events = len(rec)
            sync_ranks = sync(params, groups)          # DP: gradient all-reduce (average)
        with torch.no_grad():
            for param in params.values():
                param -= lr * param.grad
        event_groups = [groups.tp_ranks] * n_tp_events + [sync_ranks] * (len(rec) - n_tp_events)
        return {"tp_index": groups.tp_index, "dp_index": groups.dp_index,
                "tp_ranks": groups.tp_ranks, "dp_ranks": groups.dp_ranks,
                "output": y.detach(), "loss": float(loss.detach()),
                "grads": {n: p.grad.detach().clone() for n, p in params.items()},
                "params": {n: p.detach().clone() for n, p in params.items()},
                "record": rec, "event_groups": event_groups}
    finally:
        destroy_groups(groups)


def expected_bytes(tp: int, dp: int, batch: int, hidden: int, ffn_hidden: int,
                   itemsize: int) -> dict[str, dict[str, int]]:
    """What one rank should issue per step, by group, from the shapes alone (ring all-reduce sends
    ``2(n-1)/n`` of its buffer per rank; rounded down per call, as the record does).

    TP group: 2 all-reduces of ``[b/dp, h]`` (g forward, f backward). DP group: one all-reduce
    per parameter shard, ``2·ffn·h/tp + ffn/tp + h`` elements in all.
    """
    act = batch // dp * hidden * itemsize
    shards = [ffn_hidden // tp * hidden, ffn_hidden // tp, hidden * ffn_hidden // tp, hidden]
    dp_bytes = [n * itemsize for n in shards]
    return {"tp": {"all_reduces": 2, "bytes": 2 * act, "sent": 2 * (2 * (tp - 1) * act // tp)},
            "dp": {"all_reduces": len(shards), "bytes": sum(dp_bytes),
                   "sent": sum(2 * (dp - 1) * b // dp for b in dp_bytes)}}


def grid_mesh(tp: int, dp: int):
    """The ``(dp, tp)`` DeviceMesh of the grid, its dims named ``("dp", "tp")`` (PyTorch's side of
    notebook 08's comparison, ``grid/pytorch.py``)."""
    from torch.distributed.device_mesh import init_device_mesh   # when it runs, not at import
    return init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
