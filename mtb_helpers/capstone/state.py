"""The training state between the ranks and the owner: packed to travel, gathered to compare.

Pickling costs ~0.1-0.2 ms per tensor whatever its size (~30 ms a redraw at 4 ranks), so a rank
sends its snapshots (``parallel.snapshot``) as one flat tensor (``pack_snapshots``) that the owner
cuts back into views (``unpack``). ``full_state`` pieces snapshot ``i`` of every rank together
into the one-process model's state, as ``layers.gather_param`` joins the tensor-parallel shards.
"""
from __future__ import annotations

import functools
import math

import torch

from mtb_helpers.capstone.grid import GridLayout
from mtb_helpers.capstone.layers import gather_param

__all__ = ["pack_snapshots", "unpack", "full_state"]

_SNAP_KEYS = ("params", "exp_avg", "exp_avg_sq")


def pack_snapshots(snapshots: list[dict], flat: torch.Tensor) -> dict:
    """On a rank: ``flat`` (its snapshots, one after another) and what ``unpack`` needs to cut it."""
    return {"flat": flat, "sizes": [len(snap[k]) for snap in snapshots for k in _SNAP_KEYS],
            "own": [snap["own"] for snap in snapshots], "step": [snap["step"] for snap in snapshots]}


def unpack(result: dict) -> dict:
    """A rank's result as the rest reads it: ``params`` ``{name: tensor}`` (the last snapshot's
    parameters cut by name), ``snapshots`` a list of ``snapshot()`` dicts (views into the flat
    tensor the rank sent)."""
    params, snaps = result["params"], result["snapshots"]
    pieces = iter(snaps["flat"].split(snaps["sizes"]))
    result["snapshots"] = [{**{k: next(pieces) for k in _SNAP_KEYS}, "own": own, "step": step}
                           for own, step in zip(snaps["own"], snaps["step"])]
    # the parameters the rank holds now: the last snapshot's (sent once, not twice)
    parts = result["snapshots"][-1]["params"].split([math.prod(shape) for shape in params["shapes"]])
    result["params"] = {n: part.view(shape) for n, part, shape in zip(params["names"], parts,
                                                                        params["shapes"])}
    return result


def _cells(results: list[dict], layout: GridLayout) -> list[list[dict]]:
    """Every (pp stage, tp index) cell's ranks (its dp x cp replicas), stage-major."""
    cells: dict[tuple[int, int], list[dict]] = {}
    for res in results:
        cells.setdefault((res["index"]["pp"], res["index"]["tp"]), []).append(res)
    return [cells[(stage, j)] for stage in range(layout.pp) for j in range(layout.tp)]


@functools.lru_cache(maxsize=16)
def _gather_index(layout: GridLayout, held: tuple, names: tuple[str, ...]) -> torch.Tensor:
    """``index`` with ``cat(cell vectors, stage-major)[index]`` the full model's flat vector in
    ``names`` order: ``gather_param`` run once on the positions ``0, 1, 2, ..`` (exact in float64).
    ``held``: per cell ``((stage name, shape), ..)``."""
    found, start = {}, 0
    for stage in range(layout.pp):
        pieces = []
        for cell in held[stage * layout.tp:(stage + 1) * layout.tp]:
            sizes = [math.prod(shape) for _, shape in cell]
            positions = torch.arange(start, start + sum(sizes), dtype=torch.float64)
            pieces.append({n: part.view(shape) for (n, shape), part in zip(cell, positions.split(sizes))})
            start += sum(sizes)
        for name, _ in held[stage * layout.tp]:
            found.update(gather_param([p[name] for p in pieces], name))
    if sorted(found) != sorted(names):
        raise ValueError(f"the ranks hold {sorted(found)}, the model has {sorted(names)}")
    return torch.cat([found[n].reshape(-1) for n in names]).long()


def full_state(results: list[dict], layout: GridLayout, i: int, names: tuple[str, ...]) -> dict:
    """Snapshot ``i`` of one call (0: before its first step) as the one-process model's state,
    ``{"params"|"exp_avg"|"exp_avg_sq": [Ψ], "step": int}`` in ``names`` order: parameters from
    each (pp, tp) cell's first replica, Adam's moments pieced from every dp x cp rank's slice."""
    cells = _cells(results, layout)
    held = tuple(tuple((n, p.shape) for n, p in cell[0]["params"].items()) for cell in cells)
    index = _gather_index(layout, held, tuple(names))
    vectors: dict[str, list] = {"params": [], "exp_avg": [], "exp_avg_sq": []}
    for owners in cells:
        snaps = [o["snapshots"][i] for o in owners]
        numel = len(snaps[0]["params"])
        vectors["params"].append(snaps[0]["params"])
        for k in ("exp_avg", "exp_avg_sq"):
            if snaps[-1]["own"] == (0, numel):   # the last replica holds all (DDP): its moments
                vectors[k].append(snaps[-1][k])
                continue
            size = max(numel, *(snap["own"][1] for snap in snaps))
            vec = torch.zeros(size, dtype=snaps[0]["params"].dtype)
            for snap in snaps:
                vec[snap["own"][0]:snap["own"][1]] = snap[k]
            vectors[k].append(vec[:numel])
    out: dict = {k: torch.cat(vecs)[index] for k, vecs in vectors.items()}   # [Ψ], names order
    out["step"] = results[0]["snapshots"][i]["step"]
    return out
