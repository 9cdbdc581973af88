"""The error report of a check: one row per (quantity, rank), a text table and an HTML table.

Each row compares what a rank computed with the single-process reference twice:

* against the reference **in the run's dtype** (same inputs, one process): ``max_abs_err``,
  ``max_rel_err`` and ``ulps`` measure only what distribution changed. Column-parallel forward
  does the very same dot products, so it is usually bit-exact (0; a BLAS library may pick another
  kernel for the narrower matrix, then 1 ulp); a row-parallel sum adds the partial products in
  another order (~1 ulp).
  ``passed`` compares ``max_abs_err`` with ``tolerance``.
* against a **float64** reference: ``fp64_err`` (the distributed result) next to
  ``ref_fp64_err`` (the one-process result in the run's dtype) shows that the reordering costs
  no more than the dtype's own rounding. For a float64 run both columns are the first one again.

Definitions (``ref`` is the reference piece this rank should hold, ``m = max|ref|``):
``max_abs_err = max|got - ref|``; ``max_rel_err = max_abs_err / m``; ``ulps = max_abs_err /
ulp(m)``, the error in units of the spacing of the dtype at the largest value;
``tolerance = atol + rtol * m`` with (rtol, atol) from ``TOLERANCES``.
"""
from __future__ import annotations

import html
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from mtb_helpers.checking.tolerances import tolerance, ulp

@dataclass
class Row:
    """One quantity on one rank. Errors are ``inf`` when the rank's tensor is missing or has the
    wrong shape (``note`` says which)."""
    quantity: str
    rank: int
    max_abs_err: float
    max_rel_err: float
    ulps: float
    tolerance: float
    passed: bool
    fp64_err: float
    ref_fp64_err: float
    note: str = ""


def compare(quantity: str, rank: int, got: torch.Tensor | None, ref: torch.Tensor,
            ref64: torch.Tensor, dtype: torch.dtype, tol: float | None = None,
            note: str = "") -> Row:
    """A ``Row`` for one rank's ``got`` against its reference piece (``ref`` in ``dtype``,
    ``ref64`` in float64; same shape). ``tol``: a check's own bar instead of ``tolerance``;
    ``note`` (e.g. ``"step 2"``) goes before what the row says about a missing tensor."""
    tol = tolerance(ref, dtype) if tol is None else tol
    if got is None or tuple(got.shape) != tuple(ref.shape):
        why = ("not produced" if got is None
               else f"shape {list(got.shape)} != expected {list(ref.shape)}")
        inf = math.inf
        return Row(quantity, rank, inf, inf, inf, tol, False, inf, inf,
                   f"{note}; {why}" if note else why)
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    err = float((got.double() - ref.double()).abs().max()) if ref.numel() else 0.0
    rel = err / scale if scale > 0 else (0.0 if err == 0 else math.inf)
    unit = ulp(scale, dtype)
    if ref64 is ref and ref.dtype == torch.float64:   # a float64 check: its reference is the fp64 one
        fp64, ref_fp64 = err, 0.0
    else:
        fp64 = float((got.double() - ref64).abs().max()) if ref.numel() else 0.0
        ref_fp64 = float((ref.double() - ref64).abs().max()) if ref.numel() else 0.0
    return Row(quantity, rank, err, rel, err / unit, tol, err <= tol, fp64, ref_fp64, note)


def exact(quantity: str, rank: int, got: float, want: float, note: str) -> Row:
    """A ``Row`` for a count or a byte total, which must equal ``want`` (tolerance 0; the ulps
    column is the error in units of 1)."""
    err = float(abs(got - want))
    return Row(quantity, rank, err, err / max(want, 1), err, 0.0, err == 0, err, 0.0, note)


def _fmt(x: float) -> str:
    if math.isinf(x):
        return "missing"
    return "0" if x == 0 else f"{x:.1e}"


_COLUMNS = ("quantity", "rank", "max abs err", "max rel err", "ulps", "tolerance",
            "fp64: distributed", "fp64: 1 process", "passed")


def _cells(row: Row) -> list[str]:
    ulps = ("missing" if math.isinf(row.ulps) else f"{row.ulps:.1f}" if row.ulps < 1e4
            else f"{row.ulps:.1e}")
    return [row.quantity, str(row.rank), _fmt(row.max_abs_err), _fmt(row.max_rel_err), ulps,
            _fmt(row.tolerance), _fmt(row.fp64_err), _fmt(row.ref_fp64_err),
            "yes" if row.passed else "NO" + (f" ({row.note})" if row.note else "")]


def json_safe(value: Any) -> Any:
    """inf/nan -> None so that ``json.dumps(report.to_dict())`` is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


@dataclass
class Report:
    """The result of a check: ``rows`` (one per (quantity, rank)), the step trace ``steps`` (a list
    of ``mtb_helpers.checking.trace.Step``), ``records`` (each rank's ``CollectiveRecord``) and ``extra``
    (check-specific data, e.g. activation memory)."""
    check: str
    config: dict
    rows: list[Row]
    steps: list = field(default_factory=list)
    records: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(r.passed for r in self.rows)

    def failed(self) -> list[Row]:
        return [r for r in self.rows if not r.passed]

    def failing(self) -> dict[str, list[int]]:
        """``{quantity: [ranks where it fails]}``, in row order."""
        out: dict[str, list[int]] = {}
        for row in self.failed():
            out.setdefault(row.quantity, []).append(row.rank)
        return out

    def verdict(self) -> str:
        """``"PASS"``, or ``"FAIL (q1, q2)"`` naming the failing quantities."""
        return "PASS" if self.passed else f"FAIL ({', '.join(self.failing())})"

    def failure_lines(self) -> list[str]:
        """One line per failing quantity: ``"  fails: q on ranks 0, 1"``."""
        return [f"  fails: {q} on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
                for q, ranks in self.failing().items()]

    def quantities(self) -> list[str]:
        return list(dict.fromkeys(r.quantity for r in self.rows))

    def row(self, quantity: str, rank: int) -> Row:
        for r in self.rows:
            if r.quantity == quantity and r.rank == rank:
                return r
        raise KeyError((quantity, rank))

    def step(self, which: int | str):
        """The trace step with this index (as printed, from 1) or name."""
        for s in self.steps:
            if s.index == which or s.name == which:
                return s
        raise KeyError(f"no step {which!r}; steps: {[s.name for s in self.steps]}")

    def __repr__(self) -> str:
        return f"<Report {self.title()}>"

    def title(self) -> str:
        cfg = ", ".join(f"{k}={v}" for k, v in self.config.items())
        verdict = ("PASSED" if self.passed
                   else f"FAILED ({len(self.failed())} of {len(self.rows)} rows)")
        return f"{self.check} [{cfg}]: {verdict}"

    def to_dict(self) -> dict:
        """JSON-ready (non-finite errors become None)."""
        return json_safe({"check": self.check, "passed": self.passed, "config": dict(self.config),
                           "rows": [asdict(r) for r in self.rows],
                           "steps": [s.to_dict() for s in self.steps],
                           "records": [rec.to_list() for rec in self.records], **self.extra})

    def table(self) -> str:
        """The rows as an aligned text table."""
        body = [list(_COLUMNS)] + [_cells(r) for r in self.rows]
        widths = [max(len(line[i]) for line in body) for i in range(len(_COLUMNS))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in body]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def __str__(self) -> str:
        text = [self.title(), self.table()]
        if self.records:
            text.append(f"collectives on rank 0: {self.records[0].summary()}")
        return "\n".join(text)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in _COLUMNS)
        body = []
        for r in self.rows:
            style = "" if r.passed else ' style="background:#f8d0c0"'
            body.append(f"<tr{style}>" + "".join(f"<td>{html.escape(c)}</td>" for c in _cells(r))
                        + "</tr>")
        foot = (f"<p>collectives on rank 0: {html.escape(self.records[0].summary())}</p>"
                if self.records else "")
        return (f"<p><b>{html.escape(self.title())}</b></p><table><thead><tr>{head}</tr></thead>"
                f"<tbody>{''.join(body)}</tbody></table>{foot}")
