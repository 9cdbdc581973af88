"""The context-parallel check: ring or all-gather attention on real ranks against one process.

    report = check_context_parallel(world_size=4, seq=16, heads=2, head_dim=4, causal=True,
                                    variant="ring", layout="zigzag", dtype=torch.float64)

The caller draws ``q, k, v, dO`` ``[b, heads, s, d]`` from ``seed`` and runs PyTorch's
``scaled_dot_product_attention`` on the full sequence (in the run's dtype and in float64). Every
rank draws the same tensors from the same seed, takes its shards (``shard_sequence(.., layout,
dim=2)``), runs the layer forward and backward (the layer keeps the record of its messages) and
returns its output and dQ, dK, dV shards, compared with the same shards of the reference.
``report.extra["cp"]`` holds, per rank, the work it did (scores computed) next to
``expected_work``, the bytes it sent next to the formulas, the most K/V it held, and (ring) which
block it held at each step with its running max. ``bug=`` swaps in a broken layer
(``cp/bugs.py``), refused where it has nothing to break. ``check_layouts`` gives several layouts'
reports from one call to the ranks (the balance explorer's comparison).
"""
from __future__ import annotations

import torch

from mtb_helpers.checking.bug import resolve, swap
from mtb_helpers.checking.report import Report, compare
from mtb_helpers.checking.tolerances import as_dtype, check_config, positive_sizes
from mtb_helpers.comm.mesh import group_rank, group_size
from mtb_helpers.cp.allgather import AllGatherAttention
from mtb_helpers.cp.reference import (expected_bytes, expected_kv_bytes, expected_work,
                                      make_cp_inputs, reference_attention)
from mtb_helpers.cp.ring import RingAttention
from mtb_helpers.cp.sharding import check_sequence, shard_positions, shard_sequence
from mtb_helpers.runtime.ranks import resolve_world_size, run

__all__ = ["check_context_parallel", "check_layouts", "VARIANTS", "QUANTITIES"]

VARIANTS = {"ring": RingAttention, "allgather": AllGatherAttention}
QUANTITIES = ("output", "q_grad", "k_grad", "v_grad")


def _on_rank(layer_cls, sizes: tuple[int, int, int, int], dtype: torch.dtype, seed: int, causal: bool,
             layouts: tuple[str, ...]) -> list[dict]:
    """On every rank, one layer per layout on this rank's shards of that layout, forward and
    backward, as one call (``together``: one shape agreement; the ring runs the layouts' rings in
    lockstep, one message per hop). Each layer keeps its own messages, so each layout's record is
    the one a call of its own gives. ``q, k, v, dO`` are drawn here from the caller's ``sizes``,
    dtype and seed, the very tensors the caller drew (cheaper than shipping them to every rank)."""
    q, k, v, dout = make_cp_inputs(*sizes, dtype, seed)        # [b, heads, s, d] each
    cp, r = group_size(), group_rank()
    layers = [layer_cls(causal, layout) for layout in layouts]
    shards = [tuple(shard_sequence(x, cp, r, layout, dim=2).requires_grad_(True) for x in (q, k, v))
              for layout in layouts]
    outs = layer_cls.together(layers, shards)                  # [b,heads,s/cp,d] per layout
    torch.autograd.backward(outs, [shard_sequence(dout, cp, r, layout, dim=2) for layout in layouts])
    return [{"output": out.detach(), "q_grad": qkv[0].grad, "k_grad": qkv[1].grad,
             "v_grad": qkv[2].grad, "record": layer.record.without_tensors(), "work": layer.work,
             "pairs": layer.pairs, "kv_peak_bytes": layer.kv_peak_bytes, "steps": layer.steps}
            for layer, qkv, out in zip(layers, shards, outs)]


def validate(cp: int, seq: int, heads: int, head_dim: int, batch: int, causal: bool,
             variant: str, layout: str) -> None:
    """Refuse bad input (ValueError naming it) before any rank starts."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {tuple(VARIANTS)}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    positive_sizes(seq=seq, heads=heads, head_dim=head_dim, batch=batch)
    check_sequence(seq, cp, layout)


def _cp_data(results: list[dict], seq: int, layout: str, causal: bool, variant: str,
             shard_bytes: int) -> dict:
    """Work, bytes, memory and the ring steps per rank, JSON-ready."""
    cp = len(results)
    work = [res["work"]["forward"] for res in results]
    expected = [expected_work(seq, cp, r, layout, causal) for r in range(cp)]
    sent = {d: [res["record"].total_bytes(direction=d, sent=True) for res in results]
            for d in ("forward", "backward")}
    formula = expected_bytes(variant, shard_bytes, cp)
    mean = sum(work) / cp
    return {
        "positions": [shard_positions(seq, cp, r, layout).tolist() for r in range(cp)],
        "work": {"forward": work, "backward": [res["work"]["backward"] for res in results],
                 "expected": expected, "full_attention": seq * seq,
                 "pairs": [res["pairs"]["forward"] for res in results],
                 "imbalance": max(work) / mean if mean else 1.0,
                 "matches_formula": work == expected},
        "bytes": {**sent, "formula": formula, "shard_bytes": shard_bytes,
                  "matches_formula": all(sent[d] == [formula[d]] * cp for d in sent)},
        "kv_peak_bytes": [res["kv_peak_bytes"] for res in results],
        "kv_peak_formula": expected_kv_bytes(variant, shard_bytes, cp),
        "steps": [res["steps"] for res in results],
    }


def check_context_parallel(world_size: int = 2, seq: int = 16, heads: int = 2,
                           head_dim: int = 4, causal: bool = True, variant: str = "ring",
                           layout: str = "contiguous", dtype=torch.float32, seed: int = 0,
                           bug: str | None = None, batch: int = 1,
                           timeout: float = 30.0, link=None) -> Report:
    """Context-parallel attention on ``world_size`` ranks against SDPA on one process.

    Shards ``[batch, heads, seq/cp, head_dim]``; ``variant`` "ring" or "allgather"; ``layout``
    "contiguous" or "zigzag". Refuses (ValueError, before any rank starts) an unknown variant,
    layout or bug, a bug that cannot show under these settings (its ``needs``, cp/bugs.py), a
    world size out of range, and a ``seq`` not divisible by cp (2·cp for zigzag).
    """
    return check_layouts(world_size=world_size, seq=seq, heads=heads, head_dim=head_dim,
                         causal=causal, variant=variant, layouts=(layout,), dtype=dtype,
                         seed=seed, bug=bug, batch=batch, timeout=timeout, link=link)[layout]


def check_layouts(world_size: int = 2, seq: int = 16, heads: int = 2, head_dim: int = 4,
                  causal: bool = True, variant: str = "ring",
                  layouts: tuple[str, ...] = ("contiguous", "zigzag"), dtype=torch.float32,
                  seed: int = 0, bug: str | None = None, batch: int = 1, timeout: float = 30.0,
                  link=None) -> dict[str, Report]:
    """``{layout: check_context_parallel(.., layout=layout)}`` for every layout in ``layouts``,
    from one call to the ranks (the layouts' layers run together, each keeping its own record),
    so each report equals the one a call of its own would give."""
    dtype, cp = as_dtype(dtype), resolve_world_size(world_size)
    layouts = tuple(dict.fromkeys(layouts))
    if not layouts:
        raise ValueError("layouts is empty: name at least one of 'contiguous', 'zigzag'")
    for layout in layouts:
        validate(cp, seq, heads, head_dim, batch, causal, variant, layout)
        bug_obj = resolve(bug, f"cp-{variant}", world_size=cp, causal=causal, layout=layout)
    layer_cls = swap(bug_obj, VARIANTS[variant])
    q, k, v, dout = make_cp_inputs(batch, heads, seq, head_dim, dtype, seed)
    per_rank = run(_on_rank, layer_cls, (batch, heads, seq, head_dim), dtype, seed, causal, layouts,
                   world_size=cp, timeout=timeout, link=link)   # link=: an emulated link (cost/)
    ref = reference_attention(q, k, v, dout, causal)
    ref64 = ref if dtype == torch.float64 else reference_attention(
        *(x.double() for x in (q, k, v, dout)), causal)
    shard_bytes = batch * heads * (seq // cp) * head_dim * q.element_size()
    reports = {}
    for i, layout in enumerate(layouts):
        results = [mine[i] for mine in per_rank]
        rows = [compare(name, r, res[name], shard_sequence(ref[name], cp, r, layout),
                        shard_sequence(ref64[name], cp, r, layout), dtype)
                for name in QUANTITIES for r, res in enumerate(results)]
        config = check_config(cp, dtype, seed, bug, seq=seq, heads=heads, head_dim=head_dim,
                              batch=batch, causal=causal, variant=variant, layout=layout)
        cp_data = _cp_data(results, seq, layout, causal, variant, shard_bytes)
        reports[layout] = Report("context_parallel", config, rows, [],
                                 [res["record"] for res in results], extra={"cp": cp_data})
    return reports
