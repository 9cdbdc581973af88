"""``check_capstone``: the tiny GPT trained under (tp, pp, dp, cp) against one process.

    report = check_capstone(tp=2, pp=2, dp=2, steps=3)

Every step is judged on its own: the reference is re-anchored on the parallel run's own state
(parameters and AdamW moments) before the step and takes that one step. A wrong step shows at the
step it breaks, and rounding cannot compound: two correct free-running runs drift apart through
AdamW (~1e-14 after one step, ~2e-8 after 200 in fp64), which is shown, not judged.

Rows: ``loss`` and ``step`` (all parameters after it) once per step, ``params`` once per rank after
the last step (its shards against the same shards of the re-anchored reference). ``extra``:
``losses`` (parallel and free-running curves), ``drift`` (``StepComparison.drift``), ``bytes`` (per
rank per step by group, measured and by formula), ``grid`` (``grid_table``), ``held_params``,
``param_errors`` (gathered final parameters against the free-running run, by name).
"""
from __future__ import annotations

import dataclasses
import functools
import threading
from typing import NamedTuple

import torch

from mtb_helpers.capstone.costs import FORMULAS, GROUP_NAMES, formula_bytes, measured_bytes
from mtb_helpers.capstone.grid import GridLayout
from mtb_helpers.capstone.layers import shard_param, stage_blocks
from mtb_helpers.capstone.model import GPTConfig
from mtb_helpers.capstone.parallel import train_parallel
from mtb_helpers.capstone.state import full_state
from mtb_helpers.capstone.reference import Reference, TrainConfig
from mtb_helpers.capstone.validate import validate
from mtb_helpers.checking.report import Report, compare, json_safe
from mtb_helpers.checking.tolerances import as_dtype

__all__ = ["check_capstone", "StepComparison", "FreeRun", "free_run", "TOLERANCE", "grid_table", "LAYOUTS"]

# fp32: AdamW scales every update to about lr whatever the gradient's size, so where a gradient
# component is near zero a rounding difference in it (another summation order over micro-batches
# and ranks) can change that weight's step by a fair fraction of lr. Measured over the issue's
# layouts, 3 steps at lr = 1e-2: parameters differ by up to 8e-5 (the fp32 single process itself
# is 2e-5 from fp64), losses by ~1e-7. The bars sit 10-100x above that and 50x below the smallest
# deliberate bug (losses 5e-3 apart, parameters 6e-2).
TOLERANCE = {torch.float64: {"loss": 1e-10, "step": 1e-10, "params": 1e-10},
             torch.float32: {"loss": 1e-5, "step": 1e-3, "params": 1e-3}}
LAYOUTS = [GridLayout(1, 1, 1, 1), GridLayout(2, 1, 1, 1), GridLayout(1, 2, 1, 1), GridLayout(1, 1, 2, 1),
           GridLayout(2, 2, 1, 1), GridLayout(2, 1, 2, 1), GridLayout(1, 2, 2, 1), GridLayout(2, 2, 2, 1),
           GridLayout(2, 1, 1, 2)]


def _row(quantity, rank, got, ref, ref64, dtype, note):
    return compare(quantity, rank, got, ref, ref64, dtype, TOLERANCE[dtype][quantity], note)


def grid_table(layout: GridLayout, cfg: GPTConfig, batch: int) -> list[dict]:
    """Per rank: its coordinates and what it holds: blocks, heads, positions, sequences."""
    mesh, out = layout.mesh(), []
    for r in range(layout.world_size):
        at = mesh.coords(r)
        blocks = stage_blocks(cfg.layers, layout.pp, at["pp"])
        heads, n, bd = cfg.heads // layout.tp, cfg.seq // layout.cp, batch // layout.dp
        out.append({"rank": r, **at, "blocks": [blocks.start, blocks.stop],
                    "embedding": at["pp"] == 0, "head": at["pp"] == layout.pp - 1,
                    "heads": [at["tp"] * heads, (at["tp"] + 1) * heads],
                    "positions": [at["cp"] * n, (at["cp"] + 1) * n],
                    "sequences": [at["dp"] * bd, (at["dp"] + 1) * bd]})
    return out


class FreeRun(NamedTuple):
    """The free-running one-process run: per step its loss and flat parameters after it (in
    ``names`` order), the final parameters by name, and the flat parameters it started from."""
    names: list[str]
    losses: list[float]
    flats: list[torch.Tensor]
    params: dict[str, torch.Tensor]
    start: torch.Tensor


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (``torch.equal`` would call -0.0 and 0.0 equal)."""
    if a.dtype != b.dtype or a.shape != b.shape or not a.dtype.is_floating_point:
        return False
    as_int = {8: torch.int64, 4: torch.int32, 2: torch.int16}[a.element_size()]
    return torch.equal(a.view(as_int), b.view(as_int))


def starts_like(state: dict, free: FreeRun) -> bool:
    """Is ``state`` (``full_state`` of a parallel run) bit for bit the free run's start (its
    parameters, AdamW's moments +0.0, step 0)? Its re-anchored step is then the free run's first."""
    return (state["step"] == 0 and _same_bits(state["params"], free.start)
            and all(_same_bits(state[k], torch.zeros_like(free.start))
                    for k in ("exp_avg", "exp_avg_sq")))


@functools.lru_cache(maxsize=2)
def free_run(cfg: GPTConfig, run_cfg: TrainConfig, dtype: torch.dtype) -> FreeRun:
    """``run_cfg.steps`` steps of the one-process run: the same for every layout, strategy and bug,
    so an explorer reuses it (the last two kept, ~0.3 MB per step, never modified)."""
    ref = Reference(cfg, run_cfg, dtype)
    start = ref.flat.clone()
    losses, flats = [], []
    for k in range(run_cfg.steps):
        loss, after = ref.step(k)
        losses.append(loss)
        flats.append(after)
    return FreeRun(list(ref.names), losses, flats, ref.named(ref.flat.clone()), start)


class _References:
    """Re-anchored references kept between checks, by setting (building one costs ~8-25 ms, an
    explorer's redraw would pay it). Safe because ``StepComparison`` steps one only from a state it
    loads whole. A check ``take``s its references and ``give``s them back: no other thread steps
    one meanwhile (the explorer prepares in a background thread). At most ``keep`` idle ones
    (~1.2 MiB each), least recently given back dropped first."""

    def __init__(self, keep: int = 2):
        self.keep = keep
        self._lock = threading.Lock()
        self._idle: list[tuple[tuple, Reference]] = []   # ((cfg, run_cfg, dtype), ref), oldest first

    def take(self, cfg: GPTConfig, run_cfg: TrainConfig, dtype: torch.dtype) -> Reference:
        key = (cfg, run_cfg, dtype)
        with self._lock:
            for i in reversed(range(len(self._idle))):
                if self._idle[i][0] == key:
                    return self._idle.pop(i)[1]
        return Reference(cfg, run_cfg, dtype)

    def give(self, ref: Reference) -> None:
        with self._lock:
            self._idle.append(((ref.cfg, ref.run, ref.dtype), ref))
            del self._idle[:max(0, len(self._idle) - self.keep)]

    def clear(self) -> None:
        with self._lock:
            self._idle.clear()


_REFERENCES = _References()


class StepComparison:
    """Fed every call's results by ``train_parallel`` (``on_call``). For each step k: the
    parallel loss and the parameters after the step against the reference re-anchored on the
    parallel run's own state before it (``rows``: the verdict; errors cannot compound), and both
    against the free-running reference (``drift()``: how far two correct runs wander apart)."""

    def __init__(self, layout: GridLayout, cfg: GPTConfig, run_cfg: TrainConfig, dtype: torch.dtype):
        self.layout, self.dtype = layout, dtype
        any_steps = dataclasses.replace(run_cfg, steps=1)   # the reference never reads it
        self.anchored = _REFERENCES.take(cfg, any_steps, dtype)
        self.anchored64 = (self.anchored if dtype == torch.float64
                           else _REFERENCES.take(cfg, any_steps, torch.float64))
        self.free = free_run(cfg, run_cfg, dtype)
        self.names = self.free.names
        self.rank = layout.mesh().rank_of(pp=layout.pp - 1)   # the last stage's first rank
        self.rows: dict[str, list] = {"loss": [], "step": []}
        self.free_losses: list[float] = []
        self.errors = {"anchored": {"loss": [], "params": []}, "free": {"loss": [], "params": []}}
        self.last_params: tuple = ()   # (reference, fp64 reference) after the last step, anchored

    def release(self) -> None:
        """Give the re-anchored references back for the next check (``_References``)."""
        for ref in {id(r): r for r in (self.anchored, self.anchored64)}.values():
            _REFERENCES.give(ref)

    def on_call(self, first: int, results: list[dict]) -> None:
        last = [r for r in results
                if r["index"]["pp"] == self.layout.pp - 1 and r["index"]["tp"] == 0]
        before = full_state(results, self.layout, 0, self.names)
        for i in range(len(last[0]["losses"])):
            k, after = first + i, full_state(results, self.layout, i + 1, self.names)
            got_loss = sum(r["losses"][i] for r in last) / len(last)
            # the run's first step from the model as made: the free run took that step already
            # (every parallel run starts there; ~9 ms of a capstone redraw's ~30 ms of reference)
            loss, want = ((self.free.losses[k], self.free.flats[k])
                          if k == 0 and starts_like(before, self.free)
                          else self.anchored.step(k, before))
            loss64, want64 = ((loss, want) if self.anchored64 is self.anchored else
                              self.anchored64.step(k, {key: value if key == "step" else value.double()
                                                       for key, value in before.items()}))
            got = after["params"]   # [Ψ] each, the one-process model's order
            note = f"step {k + 1}"
            losses = (torch.tensor([v], dtype=torch.float64) for v in (got_loss, loss, loss64))
            self.rows["loss"].append(_row("loss", self.rank, *losses, self.dtype, note))
            self.rows["step"].append(_row("step", self.rank, got, want, want64, self.dtype, note))
            free_loss = self.free.losses[k]
            self.free_losses.append(free_loss)
            for kind, ref_loss, ref_params in (("anchored", loss, want),
                                               ("free", free_loss, self.free.flats[k])):
                self.errors[kind]["loss"].append(abs(got_loss - ref_loss))
                self.errors[kind]["params"].append(float((got.double() - ref_params.double())
                                                         .abs().max()))
            before = after
        last = self.anchored.named(want)
        self.last_params = (last, last if want64 is want else self.anchored64.named(want64))

    def drift(self) -> dict:
        """``{"steps": [1..N], "anchored"|"free": {"loss"|"params": [max abs error per step]},
        "tolerance": {"loss", "params"}}`` (None where a value is not finite)."""
        return {"steps": list(range(1, len(self.free_losses) + 1)),
                **{kind: {q: json_safe(v) for q, v in errs.items()}
                   for kind, errs in self.errors.items()},
                "tolerance": {"loss": TOLERANCE[self.dtype]["loss"],
                              "params": TOLERANCE[self.dtype]["step"]}}


def check_capstone(tp: int = 1, pp: int = 1, dp: int = 1, cp: int = 1, steps: int = 3,
                   microbatches: int = 2, schedule: str = "1f1b", sequence_parallel: bool = True,
                   strategy: str = "ddp", seed: int = 0, dtype=torch.float64, batch: int = 8,
                   lr: float = 1e-2, weight_decay: float = 0.01, bug: str | None = None,
                   cfg: GPTConfig = GPTConfig(), timeout: float = 60.0,
                   progress=None) -> Report:
    """Train on ``tp*pp*dp*cp`` ranks and on one process; see the module docstring. ``timeout``
    guards each call of a few steps, not the run (see ``train_parallel``); ``progress(done,
    steps, loss, seconds_per_step)`` is called as steps finish. Bad sizes, non-finite numbers and
    unknown bugs are refused (ValueError) before any rank starts."""
    dtype = as_dtype(dtype)
    layout = GridLayout(tp, pp, dp, cp)
    run_cfg = TrainConfig(steps, batch, lr, weight_decay, seed)
    validate(layout, cfg, run_cfg, microbatches, schedule, sequence_parallel, strategy, timeout)
    comparison = StepComparison(layout, cfg, run_cfg, dtype)
    try:
        result = train_parallel(tp, pp, dp, cp, steps, microbatches, schedule, sequence_parallel,
                                seed, dtype, strategy, batch, lr, weight_decay, cfg, bug, timeout,
                                progress, comparison.on_call)
    finally:
        comparison.release()
    rows = comparison.rows["loss"] + comparison.rows["step"]
    d = dtype.itemsize
    sent, formula = [], []
    for r, res in enumerate(result.per_rank):
        names = list(res["params"])
        got = torch.cat([res["params"][n].reshape(-1) for n in names])
        ref, ref64 = comparison.last_params   # one dict twice in float64: cut it once
        want = [torch.cat([shard_param(p, n, tp, res["index"]["tp"]).reshape(-1) for n in names])
                for p in ((ref,) if ref64 is ref else (ref, ref64))]
        rows.append(_row("params", r, got, want[0], want[-1], dtype, f"after step {steps}"))
        sent.append(measured_bytes(res["record"]))
        formula.append(formula_bytes(layout, cfg, batch, microbatches, sequence_parallel,
                                     strategy, res["index"], got.numel(), d))
    param_errors = {n: float((p.double() - comparison.free.params[n].double()).abs().max())
                    for n, p in result.params.items()}
    extra = {
        "losses": {"parallel": result.losses, "reference": comparison.free_losses},
        "drift": comparison.drift(),
        "bytes": {"unit": "bytes sent per rank per step", "groups": list(GROUP_NAMES),
                  "per_rank": sent, "formula": formula, "formula_text": FORMULAS},
        "grid": grid_table(layout, cfg, batch),
        "held_params": [sum(p.numel() for p in res["params"].values()) for res in result.per_rank],
        "param_errors": json_safe(param_errors),
    }
    config = {**result.config, "bug": bug}
    return Report("capstone", config, rows, [], result.records, extra=extra)
