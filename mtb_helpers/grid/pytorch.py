"""Notebook 08 in PyTorch's own API: a 2-D ``DeviceMesh`` for the tp x dp grid.

    res = pytorch_grid(world_size=4, tp=2, dp=2)
    print(res); print(res.summary())

The course builds the grid by hand (``grid.make_groups``); PyTorch names the same grid

    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    mesh["tp"].get_group()     # the row this rank sits in: its tensor-parallel group
    mesh["dp"].get_group()     # the column: its data-parallel group

(the last mesh dim varies fastest: ``tp`` groups are neighbouring ranks, as in Megatron). On every
rank one SGD step runs twice: ``grid_step_on_rank``, and ``parallelize_module(mlp, mesh["tp"],
{fc1: Colwise, fc2: Rowwise})`` on this replica's rows with each grad shard all-reduced over
``mesh["dp"]`` and divided by ``dp``. Compared per rank: output rows, loss, grad and parameter
shards; the collectives per group side by side. ``bug="mesh-dims-swapped"`` names the dims the
wrong way round: tensor parallelism then runs down a column.
"""
from __future__ import annotations

import copy
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from mtb_helpers.checking.agreement import (Agreement, agreement, course_counts, local,
                                            torch_counts)
from mtb_helpers.checking.bug import Bug, resolve, swap
from mtb_helpers.comm.records import CollectiveRecord
from mtb_helpers.comm.sharding import shard_range
from mtb_helpers.grid.check import validate_sizes
from mtb_helpers.grid.layers import DP_REGION, PARAMS, grid_mesh, grid_step_on_rank
from mtb_helpers.runtime.ranks import resolve_world_size, run
from mtb_helpers.tp.reference import draw_inputs

__all__ = ["pytorch_grid", "grid_on_rank"]
_MAP = [("grid.make_groups(tp, dp)", 'init_device_mesh("cpu", (dp, tp), ("dp", "tp"))'),
        ("rank = dp_index * tp + tp_index", "the last mesh dim (tp) varies fastest"),
        ("ParallelMLP in groups.tp_group", 'parallelize_module(mlp, mesh["tp"], plan)'),
        ("average_gradients over groups.dp_group", 'all-reduce over mesh["dp"].get_group(), / dp')]


def _split(rec: CollectiveRecord, direction: str, dp_sync: bool) -> dict[str, int]:
    events = [e for e in rec.events if (e.region == DP_REGION) == dp_sync]
    return course_counts(CollectiveRecord(events), direction)


def _destroy(mesh) -> None:
    """Free the mesh's subgroups: the rank pool is reused, so each call would otherwise leak."""
    import torch.distributed as dist

    for name in ("dp", "tp"):
        group = mesh.get_group(name)
        if group is not None and group != dist.group.WORLD:
            dist.destroy_process_group(group)


def grid_on_rank(fc1: nn.Linear, fc2: nn.Linear, x: torch.Tensor, target: torch.Tensor,
                 tp: int, dp: int, lr: float, bug: Bug | None = None) -> dict:
    """Run on every rank: the course's grid step and the DeviceMesh one on the same full layers and
    batch ``x, target [b, h]``; the pieces this rank holds and the counts per group."""
    import torch.distributed as dist
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    res = grid_step_on_rank(fc1, fc2, x, target, tp, dp, lr)
    rec = res["record"]
    course = {"output": res["output"], "loss": torch.tensor([res["loss"]], dtype=x.dtype),
              **{f"{n}_grad": res["grads"][n] for n in PARAMS},
              **{f"{n}_after_step": res["params"][n] for n in PARAMS}}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mesh = swap(bug, grid_mesh)(tp, dp)
        try:
            mlp = nn.Sequential(copy.deepcopy(fc1), nn.GELU(), copy.deepcopy(fc2))
            parallelize_module(mlp, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
            replicas, replica = mesh["dp"].size(), mesh.get_local_rank("dp")
            lo, hi = shard_range(x.shape[0], replicas, replica)
            x_local = x[lo:hi].clone().requires_grad_(True)
            with CommDebugMode() as fwd:
                y = mlp(x_local)
                loss = F.mse_loss(y, target[lo:hi])
            with CommDebugMode() as bwd:
                loss.backward()
            params = dict(zip(PARAMS, (mlp[0].weight, mlp[0].bias, mlp[2].weight, mlp[2].bias)))
            with CommDebugMode() as sync, torch.no_grad():
                for p in params.values() if replicas > 1 else ():   # one replica: nothing to sum
                    grad = p.grad.to_local()            # this rank's shard, shared storage
                    dist.all_reduce(grad, group=mesh["dp"].get_group())
                    grad /= replicas
            with torch.no_grad():
                for p in params.values():
                    p.to_local().sub_(lr * p.grad.to_local())
            got = {"output": local(y), "loss": loss.detach().reshape(1),
                   **{f"{n}_grad": local(p.grad) for n, p in params.items()},
                   **{f"{n}_after_step": local(p) for n, p in params.items()}}
            groups = {"tp": dist.get_process_group_ranks(mesh["tp"].get_group()),
                      "dp": dist.get_process_group_ranks(mesh["dp"].get_group())}
        finally:
            _destroy(mesh)
    counts = {"forward (tp group)": (torch_counts(fwd), _split(rec, "forward", False)),
              "backward (tp group)": (torch_counts(bwd), _split(rec, "backward", False)),
              "grad sync (dp group)": (torch_counts(sync), _split(rec, "backward", True))}
    return {"torch": got, "course": course, "counts": counts, "groups": groups,
            "course_groups": {"tp": res["tp_ranks"], "dp": res["dp_ranks"]}}


def pytorch_grid(world_size: int = 4, tp: int = 2, dp: int = 2, batch: int = 12, hidden: int = 4,
                 ffn_hidden: int = 6, seed: int = 0, lr: float = 0.1, bug: str | None = None,
                 timeout: float = 60.0) -> Agreement:
    """A ``(dp, tp)`` DeviceMesh, TP MLP on ``mesh["tp"]``, grad all-reduce on ``mesh["dp"]``,
    one SGD step, against the course's grid step on the same ranks."""
    t = resolve_world_size(world_size)
    validate_sizes(t, tp, dp, ffn_hidden, batch)
    wrong = resolve(bug, "pytorch_grid")
    (fc1, fc2), x, target = draw_inputs(seed, (batch,), torch.float64, (hidden, ffn_hidden),
                                        (ffn_hidden, hidden))
    results = run(grid_on_rank, fc1, fc2, x, target, tp, dp, lr, wrong, world_size=t,
                  timeout=timeout)
    same = all(r["groups"] == r["course_groups"] for r in results)
    notes = [f"rank 0: mesh['tp'] = ranks {results[0]['groups']['tp']}, mesh['dp'] = ranks "
             f"{results[0]['groups']['dp']}; on every rank the same groups as the course's: "
             f"{'yes' if same else 'NO'}"]
    return agreement(f"tp={tp} x dp={dp} grid", results, _MAP, bug, tuple(notes))
