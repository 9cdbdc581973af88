"""The step trace of a check: for each step, what each rank holds and how far it is from the truth.

A check describes its steps with ``StepSpec``s. Each rank runs the real layer once
(``trace_on_rank``) and reports, for every spec, the tensor it observed: a parameter, its grad,
the input, the output, the input or output of a recorded collective, or a module's output (forward
hook) or output grad (backward hook). Nothing is recomputed on the side, so a broken layer shows up
in the trace exactly where it goes wrong, and a collective it never issued shows as missing.

Every tensor is drawn as its 2-D view ``[rows, cols]``: an activation ``[.., n]`` is
``[prod(..), n]``, a bias is ``[1, out]``, and a weight is shown in the math layout of
``Y = X @ W + bias``, ``W = weight.T`` ``[in, out]``, so a column-parallel shard really is a block of
columns (``W = [W0, ..., Wn]``) and a row-parallel shard a block of rows. A step's ``layout`` says
which part of that view rank ``r`` holds, in DTensor's placements as every layer's
``input_layouts`` / ``output_layouts`` do (comm/sharding.py): ``Shard(0)`` (its contiguous block
of rows), ``Shard(-1)`` (of columns), ``Replicate()`` (all of it), ``Partial()`` (all of it, but
only its addend of a sum; ``Partial("max")``: its candidate for a max). An activation's view keeps
its last dim, so its placements read as the layer declares them; a weight's are those of
``W = weight.T``: a column-parallel weight, ``Shard(0)`` of nn.Linear's ``weight``, is ``Shard(-1)``
of ``W``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.distributed.tensor import Partial, Placement, Replicate, Shard

from mtb_helpers.comm.mesh import group_rank, group_size
from mtb_helpers.comm.records import CollectiveRecord, record
from mtb_helpers.checking.report import Report, compare
from mtb_helpers.checking.tolerances import tolerance
from mtb_helpers.comm.sharding import local_piece, name, shard_range

LAYOUTS = (Shard(0), Shard(-1), Replicate(), Partial(), Partial("max"))   # a step's 2-D view


@dataclass(frozen=True)
class StepSpec:
    """One step of a check. ``source`` says where a rank finds the step's tensor:
    ``("param", path)``, ``("grad", path)``, ``("input",)``, ``("input_grad",)``, ``("output",)``,
    ``("record", region, direction, "in" | "out")``, ``("hook", path, "out" | "grad_out")``.
    ``collective`` = ``(region, direction)`` of the region event this step shows, if any.
    ``layout``: the placement of the step's 2-D view, one of ``LAYOUTS``."""
    key: str
    name: str
    phase: str
    tensor: str
    formula: str
    layout: Placement
    source: tuple
    collective: tuple | None = None

    def __post_init__(self):
        if not any(self.layout == p for p in LAYOUTS):   # Shard(0) == "rows" is False, not an error
            raise ValueError(f"step {self.key!r}: layout {self.layout!r} is not a placement of a 2-D "
                             f"view; use Shard(0) (rows), Shard(-1) (columns), Replicate(), Partial() "
                             f"or Partial('max')")


@dataclass
class Holding:
    """What one rank holds at one step: its block ``rows`` x ``cols`` of the global 2-D view
    (half-open ranges), whether it is a partial sum, the local tensor's shape (``None`` if the rank
    never produced it) and its max abs error against the reference piece."""
    rank: int
    rows: tuple[int, int]
    cols: tuple[int, int]
    partial: bool
    shape: tuple[int, ...] | None
    max_abs_err: float | None
    passed: bool


@dataclass
class Step:
    """One step of the trace; ``holdings[r]`` is rank r's part. ``collective`` is the event dict
    of the region this step runs (rank 0's record), ``None`` for a local step, and
    ``{"missing": True, ...}`` when the layer should have issued one but did not. ``layout`` is the
    spec's placement as the code that makes it (``"Shard(-1)"``, ``"Partial()"``): JSON-ready."""
    index: int
    name: str
    phase: str
    tensor: str
    formula: str
    global_shape: tuple[int, int]
    layout: str
    collective: dict | None
    holdings: list[Holding]
    tolerance: float

    @property
    def passed(self) -> bool:
        return all(h.passed for h in self.holdings)

    @property
    def max_abs_err(self) -> float | None:
        errs = [h.max_abs_err for h in self.holdings if h.max_abs_err is not None]
        return max(errs) if len(errs) == len(self.holdings) else None

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}

    def __str__(self) -> str:
        err = "missing" if self.max_abs_err is None else f"{self.max_abs_err:.1e}"
        coll = ""
        if self.collective:
            coll = (f" [{self.collective['op']} NOT ISSUED]" if self.collective.get("missing")
                    else f" [{self.collective['op']} {self.collective['direction']}]")
        return (f"{self.index}. {self.phase} {self.name}: {self.formula}{coll} - {self.layout} "
                f"{self.tensor} {list(self.global_shape)}, max err {err}"
                f"{'' if self.passed else ' FAILED'}")


def as2d(x: torch.Tensor) -> torch.Tensor:
    """The 2-D view a figure draws: ``[..., n] -> [prod(...), n]``, a vector -> ``[1, n]``."""
    return x.reshape(1, -1) if x.dim() == 1 else x.reshape(-1, x.shape[-1])


def block(shape: tuple[int, int], layout: Placement, world_size: int, rank: int):
    """``(rows, cols)`` ranges of rank ``rank``'s part of a ``shape`` 2-D view under ``layout``."""
    rows, cols = (0, shape[0]), (0, shape[1])
    if layout == Shard(0):
        rows = shard_range(shape[0], world_size, rank)
    elif layout == Shard(-1):
        cols = shard_range(shape[1], world_size, rank)
    return rows, cols


def piece(ref, layout: Placement, world_size: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s reference piece (2-D). For a ``Partial`` step ``ref`` is the per-rank list
    (what each rank's addend should be: a sum's split is not unique, so the check says which)."""
    if isinstance(layout, Partial):
        return as2d(ref[rank])
    ref = as2d(ref)
    (r0, r1), (c0, c1) = block(tuple(ref.shape), layout, world_size, rank)
    return ref[r0:r1, c0:c1]


def _find(module: nn.Module, path: str):
    obj = module
    for part in path.split("."):
        obj = getattr(obj, part, None) if part else obj
    return obj


def trace_on_rank(build, layers: tuple, x: torch.Tensor, dy: torch.Tensor,
                  specs: list[StepSpec]) -> dict:
    """Run on every rank: ``module = build(*layers)``, ``y = module(x_r)``, ``y.backward(dy_r)``
    inside a collective record, where ``x_r``/``dy_r`` are this rank's pieces of the full ``x``
    and ``dy``, cut as the module's ``input_layouts`` / ``output_layouts`` say. Returns
    ``{"obs": {key: tensor}, "record": CollectiveRecord, "rank": r}``
    with an entry for every spec whose source exists.
    """
    t = group_size()
    r = group_rank()
    module = build(*layers)
    x = local_piece(x, module.input_layouts, r, t).clone().requires_grad_(True)
    dy = local_piece(dy, module.output_layouts, r, t)
    hooked: dict[tuple, torch.Tensor] = {}
    handles = []
    for s in specs:
        if s.source[0] != "hook":
            continue
        sub, what = _find(module, s.source[1]), s.source[2]
        if what == "out":
            handles.append(sub.register_forward_hook(
                lambda m, i, o, k=s.source: hooked.__setitem__(k, o.detach().clone())))
        else:
            handles.append(sub.register_full_backward_hook(
                lambda m, gi, go, k=s.source: hooked.__setitem__(k, go[0].detach().clone())))
    with record(keep_tensors=True) as rec:
        y = module(x)
        y.backward(dy)
    for h in handles:
        h.remove()
    obs = {}
    plain = {"input": x, "input_grad": x.grad, "output": y}
    for s in specs:
        kind = s.source[0]
        got = plain.get(kind)
        if kind in ("param", "grad"):
            p = _find(module, s.source[1])
            got = p if kind == "param" else (p.grad if p is not None else None)
            got = got.T if got is not None and got.dim() == 2 else got   # W = weight.T [in, out]
        elif kind == "hook":
            got = hooked.get(s.source)
        elif kind == "record":
            _, region, direction, end = s.source
            for e, pair in zip(rec.events, rec.tensors):
                if region in (e.region, e.operator) and e.direction == direction:
                    got = pair[0] if end == "in" else pair[1]
                    break
        if got is not None:
            obs[s.key] = got.detach().clone()
    return {"obs": obs, "record": rec.without_tensors(), "rank": r}


def _collective(spec: StepSpec, rec: CollectiveRecord) -> dict | None:
    if spec.collective is None:
        return None
    region, direction = spec.collective
    for e in rec.events:
        if region in (e.region, e.operator) and e.direction == direction:
            return {**asdict(e), "shape": list(e.shape), "out_shape": list(e.out_shape),
                    "missing": False, "label": e.describe()}
    return {"missing": True, "region": region, "direction": direction, "op": "collective",
            "label": f"{direction} {region}: not issued"}


def build_steps(specs: list[StepSpec], results: list[dict], refs: dict,
                dtype: torch.dtype) -> list[Step]:
    """The trace from every rank's ``trace_on_rank`` result and the references ``refs[key]``
    (global tensor in ``dtype``; for a ``Partial`` step, the list of per-rank addends)."""
    t = len(results)
    steps = []
    for index, spec in enumerate(specs, start=1):
        ref = refs[spec.key]
        partial = isinstance(spec.layout, Partial)
        shape = tuple(as2d(ref[0] if partial else ref).shape)
        tol = tolerance(as2d(ref[0] if partial else ref), dtype)
        holdings = []
        for r, res in enumerate(results):
            want = piece(ref, spec.layout, t, r)
            got = res["obs"].get(spec.key)
            row = compare(spec.key, r, None if got is None else as2d(got), want, want, dtype)
            rows, cols = block(shape, spec.layout, t, r)
            holdings.append(Holding(r, rows, cols, partial,
                                    None if got is None else tuple(got.shape),
                                    None if row.note else row.max_abs_err, row.passed))
        steps.append(Step(index, spec.name, spec.phase, spec.tensor, spec.formula, shape,
                          name(spec.layout), _collective(spec, results[0]["record"]), holdings, tol))
    return steps


def traced_report(check: str, config: dict, specs: list[StepSpec], quantities: list[tuple[str, str]],
                  results: list[dict], refs: dict, refs64: dict, dtype: torch.dtype,
                  extra: dict | None = None) -> Report:
    """The ``Report`` of a traced check, from the ranks' ``trace_on_rank`` results: a row for
    each ``(quantity, step key)`` and rank (the step's tensor against the reference piece in
    ``dtype``, ``refs``, and in float64, ``refs64``), the step trace (``build_steps``) and every
    rank's record."""
    layout = {s.key: s.layout for s in specs}
    t = len(results)
    rows = []
    for quantity, key in quantities:
        for r, res in enumerate(results):
            got = res["obs"].get(key)
            rows.append(compare(quantity, r, None if got is None else as2d(got),
                                piece(refs[key], layout[key], t, r),
                                piece(refs64[key], layout[key], t, r).double(), dtype))
    return Report(check, config, rows, build_steps(specs, results, refs, dtype),
                  [res["record"] for res in results], extra or {})
