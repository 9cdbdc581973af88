"""``calibrate``: time each collective on this machine's ranks and fit the α-β model to it.

    cal = calibrate(world_size=2, sizes=(2**10, 2**14, 2**18, 2**22), collectives=("all-reduce",))
    cal.fits["all-reduce"].alpha, .bandwidth, .residuals, .link     # least squares, per collective
    cal.rows                        # one row per (collective, size): median seconds, samples, busbw

For every collective and size: ``warmup`` untimed runs, then ``k`` timed runs, each after a
barrier; a run's time is the slowest rank's, the row's the median of the ``k``. The fit solves
``T = a·α + b·n/β`` for α and 1/β by least squares over the sizes, with ``(a, b)`` the ring
algorithm's coefficients (:func:`mtb_helpers.cost.model.coefficients`), so α and β are in the
units of one message on one link, comparable across collectives and world sizes. Under
``link=`` the emulated link is what gets calibrated (its α and β come back: a test of both).
"""
from __future__ import annotations

import numbers
import os
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from mtb_helpers.cost.model import COLLECTIVES, Link, busbw, coefficients, n_half, normalize, predict, whole
from mtb_helpers.runtime.ranks import resolve_world_size, run

__all__ = ["calibrate", "Calibration", "Fit", "DEFAULT_SIZES"]

DEFAULT_SIZES = tuple(2**e for e in range(10, 23, 2))     # 1 KiB .. 4 MiB, x4 apart
MEMORY_PER_BYTE = 4   # a rank holds about input + output + gloo's staging copies per byte of S


@dataclass(frozen=True)
class Fit:
    """α (seconds) and β (bytes/s) fitted to one collective; ``residuals`` are measured minus
    fitted seconds, size by size; ``relative`` the same divided by the measured time."""
    collective: str
    alpha: float
    bandwidth: float
    sizes: tuple[int, ...]
    residuals: tuple[float, ...]
    relative: tuple[float, ...]

    @property
    def link(self) -> Link:
        return Link(self.alpha, self.bandwidth)

    @property
    def n_half(self) -> float:
        """α·β: a single message of this many bytes spends as long on α as on its bytes."""
        return self.alpha * self.bandwidth


@dataclass
class Calibration:
    """What ``calibrate`` measured and fitted; plain data (``to_dict()`` is JSON-ready)."""
    world_size: int
    rows: list[dict] = field(default_factory=list)
    fits: dict[str, Fit] = field(default_factory=dict)
    link: Link | None = None

    def measured(self, collective: str) -> tuple[list[int], list[float]]:
        """Sizes and median seconds of one collective, in size order."""
        rows = [r for r in self.rows if r["collective"] == normalize(collective)]
        return [r["bytes"] for r in rows], [r["seconds"] for r in rows]

    def table(self) -> str:
        """One line per (collective, size): measured, fitted, residual, busbw; then the fits."""
        lines = [f"{'collective':<15}{'bytes':>10}{'measured':>12}{'fitted':>12}{'resid':>8}"
                 f"{'busbw':>12}"]
        for r in self.rows:
            fit = self.fits[r["collective"]]
            fitted = predict(r["collective"], r["bytes"], self.world_size, fit.link)
            lines.append(f"{r['collective']:<15}{r['bytes']:>10}{r['seconds'] * 1e6:>10.1f}us"
                         f"{fitted * 1e6:>10.1f}us{(r['seconds'] - fitted) / r['seconds']:>+8.0%}"
                         f"{r['busbw'] / 1e9:>8.3f}GB/s")
        lines.append("")
        for name, fit in self.fits.items():
            crossover = n_half(name, self.world_size, fit.link)   # where its two terms are equal
            lines.append(f"{name}: α = {fit.alpha * 1e6:.1f} µs, β = {fit.bandwidth / 1e9:.3f} "
                         f"GB/s, α·β = {fit.n_half / 1e3:.1f} kB, its crossover n½ = "
                         f"{crossover / 1e3:.1f} kB, worst residual "
                         f"{max(map(abs, fit.relative)):.0%}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"world_size": self.world_size, "rows": self.rows,
                "link": None if self.link is None else [self.link.alpha, self.link.bandwidth],
                "fits": {n: {"alpha": f.alpha, "bandwidth": f.bandwidth, "n_half": f.n_half,
                             "sizes": list(f.sizes), "residuals": list(f.residuals),
                             "relative": list(f.relative)} for n, f in self.fits.items()}}


def _elements(collective: str, nbytes: int, p: int) -> int:
    """float32 elements of the tensor each rank hands over so that S is ``nbytes`` (rounded)."""
    n = max(nbytes // 4, 1)
    return max(n // p, 1) if collective == "all-gather" else max(n // p, 1) * p


def _time_on_ranks(plan: list[tuple[str, int]], warmup: int, k: int) -> list[list[float]]:
    """On every rank: for each (collective, elements), warm-up then k timed runs after a barrier."""
    import torch
    import torch.distributed as dist

    p, r = dist.get_world_size(), dist.get_rank()
    out = []
    for collective, n in plan:
        x = torch.ones(n)
        # torch 2.13 renamed the tensor forms (the old names warn); Colab's torch has only the old
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        ops = {"all-reduce": lambda: dist.all_reduce(x),
               "broadcast": lambda: dist.broadcast(x, src=0),
               "all-gather": lambda: gather(x.new_empty(n * p), x),
               "reduce-scatter": lambda: scatter(x.new_empty(n // p), x),
               "all-to-all": lambda: dist.all_to_all_single(torch.empty_like(x), x),
               "send/recv": lambda: (dist.send(x, 1) if r == 0 else
                                     dist.recv(x, 0) if r == 1 else None)}
        times = []
        for i in range(warmup + k):
            dist.barrier()
            t0 = time.perf_counter()
            ops[collective]()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        out.append(times)
    return out


def _fit(collective: str, p: int, sizes: list[int], seconds: list[float]) -> Fit:
    a, b = coefficients(collective, p)
    design = np.array([[a, b * n] for n in sizes], dtype=float)
    target = np.array(seconds, dtype=float)
    # least squares on the *relative* error (each row divided by its measured time), as the
    # log-log figure reads it: plain least squares lets the largest sizes' milliseconds decide
    # alone, and one noisy small size then moves α by a factor of several
    weighted, ones = design / target[:, None], np.ones_like(target)
    alpha, inv_beta = np.linalg.lstsq(weighted, ones, rcond=None)[0]
    if inv_beta <= 0 or alpha <= 0:   # noise made one term negative: fit the other one alone
        if inv_beta <= 0:
            alpha, inv_beta = float(np.linalg.lstsq(weighted[:, :1], ones, rcond=None)[0][0]), 1e-15
        else:
            alpha, inv_beta = 1e-9, float(np.linalg.lstsq(weighted[:, 1:], ones, rcond=None)[0][0])
    fitted = design @ np.array([alpha, inv_beta])
    resid = target - fitted
    return Fit(collective, float(alpha), float(1 / inv_beta), tuple(sizes),
               tuple(float(x) for x in resid), tuple(float(x) for x in resid / target))


def _measured_bytes(collective: str, n: int, p: int) -> int:
    """The S a row measures when each rank hands over ``n`` float32 elements (``_elements``)."""
    return 4 * (n * p if collective == "all-gather" else n)


def _validate(world_size: int, sizes, collectives, k: int, warmup: int) -> tuple[list, list, int, int]:
    names = [normalize(c) for c in (collectives or COLLECTIVES)]
    if world_size < 2:   # one rank sends nothing: every row would be ~0 s and the fit made up
        raise ValueError(f"world_size={world_size}: a calibration needs at least 2 ranks (on one "
                         "rank a collective sends nothing, so there is no α or β to fit)")
    sizes = list(sizes if sizes is not None else DEFAULT_SIZES)
    if any(isinstance(s, bool) or not isinstance(s, numbers.Integral) for s in sizes):
        raise ValueError(f"sizes must be ints (bytes), got {sizes!r}")
    sizes = [int(s) for s in sizes]
    if any(s < 4 for s in sizes):
        raise ValueError(f"sizes {sizes} include {min(sizes)} bytes, less than one float32 "
                         "element (4 bytes): nothing would be sent")
    k, warmup = whole("k", k), whole("warmup", warmup, 0)
    for name in names:   # a fit of two unknowns needs two different sizes really measured
        kept = sorted({_measured_bytes(name, _elements(name, s, world_size), world_size)
                       for s in sizes})
        if len(kept) < 2:
            raise ValueError(
                f"sizes {sizes} round to {len(kept)} distinct size ({kept[0]} bytes) for {name} on "
                f"{world_size} ranks (whole float32 elements, split evenly over the ranks); a fit "
                "of α and β needs at least two")
    need = MEMORY_PER_BYTE * max(sizes) * world_size
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        free = None
    if free is not None and need > free // 2:
        raise ValueError(f"sizes up to {max(sizes)} bytes need about {need / 2**20:.0f} MiB on "
                         f"{world_size} ranks; this machine has {free / 2**20:.0f} MiB free: "
                         "use smaller sizes")
    return names, sorted(set(sizes)), k, warmup


def calibrate(world_size: int = 2, sizes=None, collectives=None, k: int = 5, warmup: int = 2,
              link: Link | None = None, time_scale: float | str = 1.0,
              timeout: float = 120.0) -> Calibration:
    """Time ``collectives`` (default: all six) at ``sizes`` (bytes S, default 1 KiB..4 MiB) on
    ``world_size`` ranks and fit α, β to each; ValueError on bad input before any rank starts.
    Under ``link`` with a ``time_scale`` (or "auto"), times are divided back by the scale used."""
    p = resolve_world_size(world_size)
    names, sizes, k, warmup = _validate(p, sizes, collectives, k, warmup)
    # sizes that round to one tensor are measured once (dict: insertion order kept)
    plan = list(dict.fromkeys((c, _elements(c, s, p)) for c in names for s in sizes))
    per_rank = run(_time_on_ranks, plan, warmup, k, world_size=p, timeout=timeout, link=link,
                   time_scale=time_scale)
    stretch = per_rank.timeline.time_scale if link is not None else 1.0
    cal = Calibration(p, link=link)
    for i, (collective, n) in enumerate(plan):
        nbytes = _measured_bytes(collective, n, p)
        runs = [max(rank[i][j] for rank in per_rank) / stretch for j in range(k)]
        seconds = statistics.median(runs)
        cal.rows.append({"collective": collective, "bytes": nbytes, "seconds": seconds,
                         "samples": runs, "busbw": busbw(collective, nbytes, seconds,
                                                         2 if collective == "send/recv" else p)})
    for collective in names:
        sizes_c, seconds_c = cal.measured(collective)
        cal.fits[collective] = _fit(collective, 2 if collective == "send/recv" else p,
                                    sizes_c, seconds_c)
    return cal
