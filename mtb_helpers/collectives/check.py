"""Check the five collectives on real ranks against one process, and measure the bytes they send.

The rank-side functions, references and formulas are in :mod:`mtb_helpers.collectives.ops`; this
module runs them on ranks (``mtb_helpers.run``), compares, and reports. Bytes sent are measured on
Linux from each rank's own ``/proc/self/io`` (bytes its threads wrote to gloo's TCP sockets), minus
gloo's 48-byte header per message.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from mtb_helpers.checking.bug import Bug, resolve, swap
from mtb_helpers.checking.report import Report, compare
from mtb_helpers.checking.tolerances import as_dtype, check_config, divisible, number
from mtb_helpers.collectives.ops import (COLLECTIVES, FORMULAS, GLOO_HEADER_BYTES, MEASURED_NOTES,
                                         RANK_FUNCTIONS, all_gather, all_reduce, decode_sources,
                                         formula_bytes, rank_input, reduce_scatter, reference,
                                         ring_reduce_scatter)
from mtb_helpers.runtime.ranks import resolve_world_size, run

# ---------------------------------------------------------------- measuring on the rank


def _io_counters() -> tuple[int, int] | None:
    try:
        with open("/proc/self/io") as f:
            fields = dict(line.split(":") for line in f if ":" in line)
        return int(fields["wchar"]), int(fields["syscw"])
    except (OSError, KeyError, ValueError):  # not Linux, or no I/O accounting
        return None


def measure(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
            repeat: int = 2) -> tuple[torch.Tensor, int | None]:
    """Inside a rank: run ``fn(x)`` ``repeat`` times; return its result and the fewest payload
    bytes this process sent during one run (None where they can't be measured). The first run
    also pays one-time writes (warnings printed once), hence the minimum."""
    sent: list[int] = []
    for _ in range(repeat):
        before = _io_counters()
        out = fn(x.clone())
        after = _io_counters()
        if before is not None and after is not None:
            wrote, calls = after[0] - before[0], after[1] - before[1]
            sent.append(max(0, wrote - GLOO_HEADER_BYTES * calls))
    measurable = len(sent) == repeat and dist.get_backend() == "gloo"
    return out, (min(sent) if measurable else None)


def _on_rank(collectives: tuple[str, ...], numel: int, dtype: torch.dtype, seed: int,
             bug: Bug | None, implementations: dict, keep_values: bool = True) -> dict:
    rank, t = dist.get_rank(), dist.get_world_size()
    device = (torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl"
              else torch.device("cpu"))   # nccl: under torchrun on GPUs
    results = {}
    for name in collectives:
        fn = swap(bug, RANK_FUNCTIONS[name])
        if fn is RANK_FUNCTIONS[name]:
            fn = implementations.get(name) or fn
        x = rank_input(name, rank, t, numel, dtype, seed).to(device)
        out, sent = measure(fn, x)
        res = {"bytes": sent}
        if keep_values:
            # Provenance: every element of rank r carries 2^r; summed cells carry several bits.
            tags = fn(torch.full_like(x, 2.0 ** rank))
            res.update(before=x.cpu(), after=out.cpu(), tags=tags.cpu())
        results[name] = res
    return results


# ---------------------------------------------------------------- the check and its report


class CollectivesReport(Report):
    """The course's ``Report`` for the collectives: a ``Row`` per (collective, rank) with the max abs
    error against the reference (tolerance 0: the inputs are small integers, so every sum is exact),
    and in ``extra["values"]`` (aligned with ``rows``) that rank's buffer before and after, the
    expected one, where each value came from and the bytes it sent, measured and by the formula.
    Its table shows those values next to the verdict."""

    def rows_for(self, collective: str) -> list[dict]:
        """The ``extra["values"]`` entries of ``collective``, one per rank (plain dicts)."""
        return [v for v in self.extra["values"] if v["collective"] == collective]

    @property
    def notes(self) -> list[str]:
        """One line per collective whose measured bytes differ from the formula, saying why."""
        values = self.extra["values"]
        off = {v["collective"] for v in values if v["bytes_measured"] is not None
               and abs(v["bytes_measured"] - v["bytes_formula"]) > 0.01 * v["V_bytes"]}
        return [f"{name}: {MEASURED_NOTES.get(name, 'measured bytes differ from the formula')}"
                for name in COLLECTIVES if name in off]

    def _cells(self) -> tuple[list[str], list[list[str]]]:
        head = ["collective", "rank", "before", "after", "max abs err", "sent (measured)",
                "sent (formula)", "result"]
        body = [[v["collective"], str(v["rank"]), _short_list(v["before"]),
                 _short_list(v["after"]), f"{v['max_abs_error']:.3g}", _bytes(v["bytes_measured"]),
                 _bytes(v["bytes_formula"]), "PASS" if v["passed"] else "FAIL"]
                for v in self.extra["values"]]
        return head, body

    def table(self) -> str:
        head, body = self._cells()
        widths = [max(len(x) for x in col) for col in zip(head, *body)]
        fmt = "  ".join(f"{{:{'<' if i < 4 else '>'}{w}}}" for i, w in enumerate(widths))
        return "\n".join([fmt.format(*head)] + [fmt.format(*b) for b in body]
                         + [f"note: {n}" for n in self.notes])

    def _repr_html_(self) -> str:
        head, body = self._cells()
        cells = "".join(f"<th>{h}</th>" for h in head)
        rows = "".join(
            "<tr>" + "".join(f"<td>{c}</td>" for c in b[:-1])
            + f"<td style='color:{'#009E73' if b[-1] == 'PASS' else '#D55E00'}'><b>{b[-1]}</b></td></tr>"
            for b in body)
        notes = "".join(f"<p><i>note: {n}</i></p>" for n in self.notes)
        return f"<p><b>{self.title()}</b></p><table><tr>{cells}</tr>{rows}</table>{notes}"


def _short_list(values: list[float], keep: int = 6) -> str:
    text = ", ".join(f"{v:g}" for v in values[:keep])
    return f"[{text}{', …' if len(values) > keep else ''}]"


def _bytes(n: float | None) -> str:
    return "n/a" if n is None else f"{n:,.0f} B"


def _validate(world_size: int, numel: int, collectives: tuple[str, ...], bug: str | None,
              seed: int) -> Bug | None:
    for name in collectives:
        if name not in COLLECTIVES:
            raise ValueError(f"unknown collective {name!r}; expected one of {COLLECTIVES}")
    number("numel", numel, lambda n: n >= 1, "a positive int", integral=True)
    divisible("numel", numel, f"the world size {world_size}", world_size,
              "each rank's chunk of the full tensor is numel/t elements")
    number("seed", seed, lambda n: n >= 0, "a non-negative int", integral=True)
    return resolve(bug, "collectives", world_size=world_size, numel=numel,
                   collectives=tuple(collectives))


def check_collectives(world_size: int = 2, numel: int = 8, dtype: torch.dtype | str = torch.float32,
                      seed: int = 0, bug: str | None = None,
                      collectives: tuple[str, ...] = COLLECTIVES,
                      implementations: dict[str, Callable] | None = None,
                      timeout: float = 30.0) -> CollectivesReport:
    """Run each collective on ``world_size`` gloo ranks and compare every rank's result with
    :func:`reference`. ``numel`` is the full tensor's length n (all-gather's output,
    reduce-scatter's input), divisible by the world size. ``implementations`` replaces the rank
    function of a collective (e.g. your own all-gather from send/recv); every rank function runs
    three times: twice while its bytes are measured, once on provenance tags that tell the figure
    which ranks each value came from. Bad input -> ValueError before any rank starts."""
    world_size = resolve_world_size(world_size)
    collectives = tuple(collectives)
    dtype = as_dtype(dtype)
    wrong = _validate(world_size, numel, collectives, bug, seed)
    results = run(_on_rank, collectives, numel, dtype, seed, wrong, dict(implementations or {}),
                  world_size=world_size, timeout=timeout)
    config = check_config(world_size, dtype, seed, bug, numel=numel)
    report = CollectivesReport("collectives", config, [], extra={"formulas": dict(FORMULAS),
                                                                 "values": []})
    for name in collectives:
        inputs = [rank_input(name, r, world_size, numel, dtype, seed) for r in range(world_size)]
        nbytes = numel * inputs[0].element_size()
        for r, (want, formula) in enumerate(zip(reference(name, inputs),
                                                formula_bytes(name, world_size, nbytes))):
            got = results[r][name]
            row = compare(name, r, got["after"], want, want.double(), dtype, tol=0.0)
            report.rows.append(row)
            report.extra["values"].append({
                "collective": name, "rank": r, "V_bytes": nbytes,
                "before": got["before"].tolist(), "after": got["after"].tolist(),
                "expected": want.tolist(),
                "sources": [decode_sources(v, world_size) for v in got["tags"].tolist()],
                "max_abs_error": row.max_abs_err, "tolerance": 0.0, "passed": row.passed,
                "bytes_measured": got["bytes"], "bytes_formula": formula})
    report.extra["notes"] = report.notes
    return report


# ---------------------------------------------------------------- bytes, decomposition, deadlock


def measure_bytes(world_sizes: tuple[int, ...] = (1, 2, 3, 4), numel: int = 12 * 1024,
                  collectives: tuple[str, ...] = COLLECTIVES, dtype: torch.dtype | str = torch.float32,
                  timeout: float = 60.0) -> list[dict]:
    """Bytes each rank sends per collective at each world size, measured next to the formula.
    Rows: collective, world_size, rank, V_bytes, measured (None off Linux), formula. ``numel`` must
    divide by every world size; 12288 float32 (48 KiB) does for 1..4 and makes headers negligible."""
    dtype = as_dtype(dtype)
    for t in world_sizes:
        _validate(resolve_world_size(t), numel, tuple(collectives), None, 0)
    rows = []
    for t in world_sizes:
        results = run(_on_rank, tuple(collectives), numel, dtype, 0, None, {}, False,
                      world_size=t, timeout=timeout)
        nbytes = numel * dtype.itemsize
        for name in collectives:
            for r, formula in enumerate(formula_bytes(name, t, nbytes)):
                rows.append({"collective": name, "world_size": t, "rank": r, "V_bytes": nbytes,
                             "measured": results[r][name]["bytes"], "formula": formula})
    return rows


def _decompose_on_rank(numel: int, dtype: torch.dtype, seed: int) -> dict:
    rank, t = dist.get_rank(), dist.get_world_size()
    x = rank_input("all-reduce", rank, t, numel, dtype, seed)
    summed, ar_bytes = measure(all_reduce, x)
    shard, rs_bytes = measure(reduce_scatter, x)
    gathered, ag_bytes = measure(all_gather, shard)
    ring_shard, ring_rs_bytes = measure(ring_reduce_scatter, x)
    return {"rank": rank, "input": x.tolist(), "all_reduce": summed.tolist(),
            "reduce_scatter": shard.tolist(), "then_all_gather": gathered.tolist(),
            "ring_reduce_scatter": ring_shard.tolist(),
            "max_abs_difference": (summed - gathered).abs().max().item(),
            "bytes": {"all-reduce": ar_bytes, "reduce-scatter": rs_bytes, "all-gather": ag_bytes,
                      "ring reduce-scatter (send/recv)": ring_rs_bytes}}


def all_reduce_as_reduce_scatter_all_gather(world_size: int = 2, numel: int = 8, seed: int = 0,
                                            dtype: torch.dtype | str = torch.float32,
                                            timeout: float = 30.0) -> dict:
    """On real ranks: all-reduce(x) [n] vs all-gather(reduce-scatter(x)) [n/t] -> [n], and the
    bytes of each step. Returns {"passed", "V_bytes", "ranks": [per-rank dict], "formula"}."""
    world_size = resolve_world_size(world_size)
    dtype = as_dtype(dtype)
    _validate(world_size, numel, COLLECTIVES, None, seed)
    ranks = run(_decompose_on_rank, numel, dtype, seed, world_size=world_size, timeout=timeout)
    nbytes = numel * dtype.itemsize
    return {"passed": all(r["max_abs_difference"] == 0 for r in ranks), "V_bytes": nbytes,
            "world_size": world_size, "ranks": ranks,
            "formula": {name: formula_bytes(name, world_size, nbytes)[0]
                        for name in ("all-reduce", "reduce-scatter", "all-gather")}}


def skip_a_collective() -> torch.Tensor:
    """Inside a rank: every rank but the last calls all_reduce; the last one returns early, so the
    others wait for a partner that never comes. gloo alone would wait 30 minutes (its default);
    the course's ranks give their process group 10 minutes and ``run()`` stops them at its own
    ``timeout``, naming where each rank waits."""
    x = torch.ones(4)
    if dist.get_rank() != dist.get_world_size() - 1:
        dist.all_reduce(x)
    return x


def deadlock_demo(world_size: int = 2, timeout: float = 3.0,
                  fn: Callable[[], object] = skip_a_collective) -> list:
    """Run ``fn`` (default :func:`skip_a_collective`): raises ``RankTimeoutError`` after
    ``timeout`` seconds, naming the ranks that finished and where each waiting rank is stuck.
    The broken pool is replaced, so the next run() works again."""
    if resolve_world_size(world_size) < 2:
        raise ValueError("a deadlock needs at least 2 ranks")
    return run(fn, world_size=world_size, timeout=timeout)
