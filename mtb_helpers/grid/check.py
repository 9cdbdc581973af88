"""The TP x DP check: one SGD step on a ``tp x dp`` grid of real ranks against one process.

    report = check_grid(world_size=4, tp=2, dp=2)
    report.passed, report.rows, report.records, report.extra["grid"], report.extra["collectives"]

The ranks run ``grid.grid_step_on_rank`` (rank ``(d, j)``: shard ``j`` of the MLP, rows ``d`` of
the batch); one process takes the same step on the whole batch, in the run's dtype and float64.
Rows per rank: its output rows, then per parameter shard the gradient after the data-parallel
average and the parameter after the step. ``bug=`` swaps in a wrong gradient sync (grid/bugs.py).
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from mtb_helpers.checking.bug import resolve, swap
from mtb_helpers.checking.report import Report, compare
from mtb_helpers.checking.tolerances import (as_dtype, check_config, divisible, number,
                                              positive_sizes)
from mtb_helpers.comm.records import CollectiveRecord
from mtb_helpers.comm.sharding import shard_range
from mtb_helpers.grid.bugs import GRID_BUGS
from mtb_helpers.grid.layers import (CONVENTION, DP_REGION, PARAMS, average_gradients,
                                     dp_group_ranks, expected_bytes, grid_step_on_rank,
                                     param_piece, tp_group_ranks, validate_grid)
from mtb_helpers.runtime.ranks import resolve_world_size, run
from mtb_helpers.tp.reference import draw_inputs

__all__ = ["check_grid", "validate_sizes", "GRID_BUGS", "GRID_QUANTITIES", "grid_reference", "group_traffic"]


GRID_QUANTITIES = ("output", *(f"{n}_grad" for n in PARAMS), *(f"{n}_updated" for n in PARAMS))


def grid_reference(fc1, fc2, x: torch.Tensor, target: torch.Tensor, lr: float,
                   dtype: torch.dtype) -> dict:
    """One process, whole batch, in ``dtype``: output ``[b, h]``, the gradient of the mean loss and
    the parameters after one SGD step, per parameter (nn.Linear layout)."""
    fc1, fc2 = (copy.deepcopy(m).to(dtype) for m in (fc1, fc2))
    y = fc2(F.gelu(fc1(x.to(dtype))))
    loss = F.mse_loss(y, target.to(dtype))
    loss.backward()
    ref = {"output": y.detach(), "loss": float(loss.detach())}
    for name, p in (("fc1", fc1), ("fc2", fc2)):
        for kind in ("weight", "bias"):
            param = getattr(p, kind)
            ref[f"{name}.{kind}_grad"] = param.grad.detach()
            ref[f"{name}.{kind}_updated"] = (param - lr * param.grad).detach()
    return ref


def _piece(quantity: str, ref: dict, res: dict, tp: int, dp: int) -> torch.Tensor:
    full = ref[quantity]
    if quantity == "output":
        lo, hi = shard_range(full.shape[0], dp, res["dp_index"])
        return full[lo:hi]
    return param_piece(quantity.rsplit("_", 1)[0], full, tp, res["tp_index"])


def _got(quantity: str, res: dict) -> torch.Tensor:
    if quantity == "output":
        return res["output"]
    name, kind = quantity.rsplit("_", 1)
    return res["grads" if kind == "grad" else "params"][name]


def group_traffic(records: list[CollectiveRecord], event_groups: list[list]) -> list[dict]:
    """Per rank, per group it communicated in (by its ranks): calls, bytes in and bytes sent,
    split into the TP regions and the DP gradient all-reduce."""
    traffic = []
    for rec, groups in zip(records, event_groups):
        per: dict[tuple, dict] = {}
        for event, ranks in zip(rec, groups):
            kind = "dp" if event.region == DP_REGION else "tp"
            entry = per.setdefault((tuple(ranks), kind), {"ranks": list(ranks), "kind": kind,
                                                          "all_reduces": 0, "bytes": 0, "sent": 0})
            entry["all_reduces"] += event.op == "all_reduce"
            entry["bytes"] += event.bytes
            entry["sent"] += event.sent_bytes
        traffic.append(list(per.values()))
    return traffic


def validate_sizes(world_size: int, tp: int, dp: int, ffn_hidden: int, batch: int) -> None:
    """``validate_grid``, then ValueError unless ``tp`` divides ``ffn_hidden`` and ``dp`` divides
    ``batch`` (the course's check and PyTorch's comparison refuse the same sizes)."""
    validate_grid(world_size, tp, dp)
    divisible("ffn_hidden", ffn_hidden, f"tp={tp}", tp, f"tensor parallelism splits it into "
              f"{tp} equal shards, one per TP-group rank")
    divisible("batch", batch, f"dp={dp}", dp, f"data parallelism gives each of the {dp} replicas "
              f"an equal slice of the batch")


def check_grid(world_size: int = 4, tp: int = 2, dp: int = 2, hidden: int = 8,
               ffn_hidden: int = 16, batch: int = 8, lr: float = 0.1, dtype=torch.float32,
               seed: int = 0, bug: str | None = None, timeout: float = 30.0) -> Report:
    """One SGD step of the TP MLP on a ``tp x dp`` grid against one process on the whole batch:
    fc1 ``[h, ffn]`` split on its columns and fc2 ``[ffn, h]`` on its rows in each TP group, X
    ``[batch, h]`` by rows across the DP groups. Bad sizes or an unknown bug: ValueError first."""

    dtype, t = as_dtype(dtype), resolve_world_size(world_size)
    positive_sizes(hidden=hidden, ffn_hidden=ffn_hidden, batch=batch)
    validate_sizes(t, tp, dp, ffn_hidden, batch)
    wrong = resolve(bug, "grid")
    number("lr", lr, lambda v: v > 0, "a positive number")
    (fc1, fc2), x, target = draw_inputs(seed, (batch,), dtype, (hidden, ffn_hidden),
                                        (ffn_hidden, hidden))
    results = run(grid_step_on_rank, fc1, fc2, x, target, tp, dp, lr,
                  swap(wrong, average_gradients), world_size=t, timeout=timeout)
    ref, ref64 = (grid_reference(fc1, fc2, x, target, lr, d) for d in (dtype, torch.float64))
    rows = [compare(q, rank, _got(q, res), _piece(q, ref, res, tp, dp),
                    _piece(q, ref64, res, tp, dp), dtype)
            for q in GRID_QUANTITIES for rank, res in enumerate(results)]
    records = [res["record"] for res in results]
    groups = [res["event_groups"] for res in results]
    extra = {
        "grid": {"tp": tp, "dp": dp, "convention": CONVENTION,
                 "tp_groups": tp_group_ranks(tp, dp), "dp_groups": dp_group_ranks(tp, dp),
                 "coords": [[res["dp_index"], res["tp_index"]] for res in results]},
        "collectives": [[{**e, "group_ranks": list(g)} for e, g in zip(rec.to_list(), gs)]
                        for rec, gs in zip(records, groups)],
        "traffic": group_traffic(records, groups),
        "expected_bytes": expected_bytes(tp, dp, batch, hidden, ffn_hidden, dtype.itemsize),
        "loss": {"reference": ref["loss"], "per_rank": [res["loss"] for res in results]},
    }
    config = check_config(t, dtype, seed, bug, tp=tp, dp=dp, hidden=hidden, ffn_hidden=ffn_hidden,
                     batch=batch, lr=lr)
    return Report("tp_x_dp", config, rows, [], records, extra)
