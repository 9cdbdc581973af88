"""The expert-parallel check: ``ExpertParallelMoE`` on real ranks against the one-process MoE.

    report = check_moe(world_size=2, num_experts=4, top_k=1, capacity_factor=None)

The caller draws the router ``[E, h]``, E experts (``h -> f -> h``), X and dY ``[n, h]`` from
``seed`` and computes the reference with ``moe_reference`` (capacity per group of n/t tokens, as
on the ranks), in the run's dtype and in float64 (the float64 one follows the same routing).
Rank r takes tokens ``r*n/t .. (r+1)*n/t``, runs the layer forward and backward inside a
collective record, and reports its output and input grad (its rows), the router grad (replicated:
every rank) and the grads of the experts it owns. ``report.extra["moe"]`` holds the routing
(which token went to which expert on which rank, what was dropped), the split sizes and the bytes
every rank sent in each all-to-all, next to the all-gather alternative. ``bug=`` swaps in a
broken layer (``moe/bugs.py``).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from mtb_helpers.comm.mesh import group_rank, group_size
from mtb_helpers.checking.bug import resolve, swap
from mtb_helpers.comm.records import record
from mtb_helpers.moe.layers import (COMBINE, COUNTS, DISPATCH, ROUTER_GRAD, Expert, ExpertParallelMoE,
                                    moe_reference)
from mtb_helpers.runtime.ranks import resolve_world_size, run
from mtb_helpers.checking.tolerances import (as_dtype, check_config, divisible, number,
                                              positive_sizes)
from mtb_helpers.checking.report import Report, compare

__all__ = ["check_moe", "make_moe_inputs", "all_gather_alternative_bytes", "EXPERT_PARAMS"]

EXPERT_PARAMS = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")


def make_moe_inputs(tokens: int, hidden: int, ffn_hidden: int, num_experts: int,
                    dtype: torch.dtype = torch.float32, seed: int = 0):
    """``(gate nn.Linear(h, E, bias=False), [Expert] * E, X [n, h], dY [n, h])`` from ``seed``.
    The router weights are scaled up so its choices are clear-cut (no near-ties)."""
    # nn.Linear draws from the global generator: seed it inside fork_rng, so that building the
    # inputs leaves the caller's own random stream (a notebook's) where it was.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        gate = nn.Linear(hidden, num_experts, bias=False, dtype=dtype)
        with torch.no_grad():
            gate.weight.mul_(4.0)
        experts = [Expert(hidden, ffn_hidden, dtype) for _ in range(num_experts)]
        x = torch.randn(tokens, hidden, dtype=dtype)
        dy = torch.randn(tokens, hidden, dtype=dtype)
    return gate, experts, x, dy


def all_gather_alternative_bytes(tokens: int, hidden: int, itemsize: int, world_size: int) -> int:
    """Bytes one rank sends without all-to-all: all-gather every token (ring: (t-1) * n/t * h),
    run its experts on the ones routed to them, reduce-scatter the outputs ((t-1)/t * n * h)."""
    t = world_size
    return 2 * (t - 1) * tokens * hidden * itemsize // t


def _grads(module: nn.Module) -> dict[str, torch.Tensor | None]:
    return {f"{name}_grad": (None if p.grad is None else p.grad.detach().clone())
            for name, p in module.named_parameters()}


def _on_rank(gate, experts, x, dy, top_k, capacity_factor, bug) -> dict:
    """Run on every rank: the layer on this rank's tokens, forward and backward, recorded."""
    t, r = group_size(), group_rank()
    n = x.shape[0] // t
    layer = swap(bug, ExpertParallelMoE).from_full(gate, experts, top_k, capacity_factor, None)
    x_r = x[r * n:(r + 1) * n].clone().requires_grad_(True)
    with record() as rec:
        y = layer(x_r)
        y.backward(dy[r * n:(r + 1) * n])
    return {"output": y.detach(), "input_grad": x_r.grad, "gate": _grads(layer.gate),
            "experts": {layer.first_expert + j: _grads(e) for j, e in enumerate(layer.experts)},
            "routing": layer.last, "record": rec.without_tensors()}


def _reference(gate, experts, x, dy, top_k, capacity_factor, t, chosen=None) -> dict:
    gate, experts = copy.deepcopy(gate), [copy.deepcopy(e) for e in experts]
    x = x.clone().requires_grad_(True)
    y, chosen, kept = moe_reference(gate, experts, x, top_k, capacity_factor, t, chosen)
    y.backward(dy)
    grads = {"gate.weight_grad": gate.weight.grad}
    for e, expert in enumerate(experts):
        for name, p in expert.named_parameters():   # an expert no token reached: zero grads
            grads[f"experts.{e}.{name}_grad"] = torch.zeros_like(p) if p.grad is None else p.grad
    return {"output": y.detach(), "input_grad": x.grad, **grads, "chosen": chosen, "kept": kept}


def _moe_data(results: list[dict], refs: dict, num_experts: int, hidden: int, itemsize: int,
              tokens: int) -> dict:
    """Routing, token counts and bytes per all-to-all, JSON-ready (lists and ints)."""
    t = len(results)
    routes = [res["routing"] for res in results]
    experts = torch.cat([rt.experts for rt in routes])
    kept = torch.cat([rt.kept for rt in routes])
    per_rank = num_experts // t
    per_expert = [[int(((rt.experts == e) & rt.kept).sum()) for e in range(num_experts)]
                  for rt in routes]
    chosen = [[int((rt.experts == e).sum()) for e in range(num_experts)] for rt in routes]

    def sent(res, region):
        return res["record"].select("all_to_all", "forward", region)[0].sent_bytes

    return {
        "tokens_per_rank": tokens // t, "capacity": routes[0].capacity,
        "owner": [e // per_rank for e in range(num_experts)],
        "experts": experts.tolist(), "weights": torch.cat([rt.weights for rt in routes]).tolist(),
        "kept": kept.tolist(),
        "source_rank": [r for r in range(t) for _ in range(tokens // t)],
        "matches_reference": bool(torch.equal(experts, refs["chosen"])
                                  and torch.equal(kept, refs["kept"])),
        "tokens_per_expert": per_expert,
        "dropped_per_expert": [sum(c[e] - k[e] for c, k in zip(chosen, per_expert))
                               for e in range(num_experts)],
        "dispatch_rows": [rt.send for rt in routes],
        "dest_expert": [rt.dest_expert.tolist() for rt in routes],
        "row_bytes": hidden * itemsize,
        "bytes": {"counts": [sent(res, COUNTS) for res in results],
                  "dispatch": [sent(res, DISPATCH) for res in results],
                  "combine": [sent(res, COMBINE) for res in results],
                  "router_grad": [sum(e.sent_bytes for e in res["record"].select(
                      region=ROUTER_GRAD)) for res in results],
                  "backward": [res["record"].total_bytes(direction="backward", sent=True)
                               for res in results],
                  "all_gather_alternative": [all_gather_alternative_bytes(
                      tokens, hidden, itemsize, t)] * t},
    }


def check_moe(world_size: int = 2, num_experts: int = 4, top_k: int = 1, tokens: int = 16,
              hidden: int = 8, ffn_hidden: int = 16, capacity_factor: float | None = None,
              dtype=torch.float32, seed: int = 0, bug: str | None = None,
              timeout: float = 30.0, link=None) -> Report:
    """``ExpertParallelMoE`` on ``world_size`` ranks against ``moe_reference`` on one process.

    X ``[tokens, hidden]`` is split by tokens, ``[n/t, h]`` per rank; rank r owns experts
    ``r*E/t .. (r+1)*E/t - 1``. Refuses (ValueError, before any rank starts) an expert count or
    token count the world size does not divide, ``top_k > num_experts``, ``capacity_factor <= 0``.
    """

    dtype, t = as_dtype(dtype), resolve_world_size(world_size)
    wrong = resolve(bug, "moe")
    positive_sizes(num_experts=num_experts, top_k=top_k, tokens=tokens, hidden=hidden,
                   ffn_hidden=ffn_hidden)
    divisible("num_experts", num_experts, f"the world size {t}", t,
              "every rank owns the same number of experts")
    if top_k > num_experts:
        raise ValueError(f"top_k={top_k} is more than num_experts={num_experts}")
    divisible("tokens", tokens, f"the world size {t}", t, "every rank holds the same number of tokens")
    if capacity_factor is not None:
        number("capacity_factor", capacity_factor, lambda c: c > 0, "None or a number > 0")
    gate, experts, x, dy = make_moe_inputs(tokens, hidden, ffn_hidden, num_experts, dtype, seed)
    results = run(_on_rank, gate, experts, x, dy, top_k, capacity_factor, wrong,
                  world_size=t, timeout=timeout, link=link)   # link=: an emulated link (cost/)
    refs = _reference(gate, experts, x, dy, top_k, capacity_factor, t)
    refs64 = _reference(copy.deepcopy(gate).double(), [e.double() for e in copy.deepcopy(experts)],
                        x.double(), dy.double(), top_k, capacity_factor, t, chosen=refs["chosen"])
    n, per_rank = tokens // t, num_experts // t
    rows = []
    for q in ("output", "input_grad"):
        rows += [compare(q, r, res[q], refs[q][r * n:(r + 1) * n], refs64[q][r * n:(r + 1) * n],
                         dtype) for r, res in enumerate(results)]
    rows += [compare("gate.weight_grad", r, res["gate"]["weight_grad"], refs["gate.weight_grad"],
                     refs64["gate.weight_grad"], dtype) for r, res in enumerate(results)]
    for e in range(num_experts):
        r = e // per_rank
        for p in EXPERT_PARAMS:
            key = f"experts.{e}.{p}_grad"
            rows.append(compare(key, r, results[r]["experts"][e][f"{p}_grad"], refs[key],
                                refs64[key], dtype))
    config = check_config(t, dtype, seed, bug, num_experts=num_experts, top_k=top_k, tokens=tokens,
                     hidden=hidden, ffn_hidden=ffn_hidden, capacity_factor=capacity_factor)
    moe = _moe_data(results, refs, num_experts, hidden, x.element_size(), tokens)
    return Report("moe", config, rows, [], [res["record"] for res in results], extra={"moe": moe})
