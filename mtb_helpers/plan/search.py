"""``plan``: every layout of a model on a cluster, which fit in memory, ranked by predicted step
time, each with its breakdown, and a reason for every one refused.

    result = plan(model("llama3-8b"), cluster("h100", gpus=64), global_batch=1024, seq_len=8192)
    result.ranked[0].layout, result.ranked[0].time.step, result.ranked[0].peak_bytes
    result.rejected[:3]      # [(layout, ["tp=16 exceeds 8 GPUs per node", ...]), ...]

Tried: every tp x pp x cp x dp whose product is the GPU count (tp over every divisor, so that a
tensor group wider than a node is refused with its reason), ep over the divisors of dp that
divide the experts, each micro-batch size in ``microbatches`` that divides the replica's batch,
each ZeRO stage, recompute mode and schedule asked for. A layout is refused when a size does not
divide (``layout_problems``) or when its busiest rank needs more than ``cluster.memory_bytes`` -
``reserve`` ("needs 93 GiB > 80 GiB"). Divisors come from the GPU count's prime factors (trial
division up to its square root), never from a loop up to the count. A count of ``MAX_GPUS`` or
more, or with more than ``MAX_GROUPINGS`` tp x pp x cp groupings, is refused at once (ValueError)
rather than weighed: each grouping is dozens of layouts (micro-batch x ZeRO x recompute), and 8e9
GPUs' 100,100 groupings would take minutes; real clusters have a few thousand (131072 GPUs: 1140).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from itertools import product

from mtb_helpers.cost.model import positive, whole
from mtb_helpers.plan.budget import StageMemory, memory_per_rank
from mtb_helpers.plan.presets import GIB
from mtb_helpers.plan.specs import ClusterSpec, Layout, ModelSpec, layout_problems
from mtb_helpers.plan.steptime import StepTime, step_time

__all__ = ["Candidate", "PlanResult", "plan", "divisors", "prime_factors",
           "check_reserve", "check_gpus", "MAX_GPUS", "MAX_GROUPINGS"]

MAX_GPUS = 2**40            # factorised at once below this (at most 2**19 trial divisions)
MAX_GROUPINGS = 20_000      # tp x pp x cp groupings weighed at most (see the module docstring)


@dataclass
class Candidate:
    """A layout that fits: its memory per pipeline stage and its predicted step time."""
    layout: Layout
    memory: list[StageMemory]
    time: StepTime

    @property
    def peak_bytes(self) -> float:
        return max(s.total for s in self.memory)

    def to_dict(self) -> dict:
        worst = max(self.memory, key=lambda s: s.total)
        return {"layout": self.layout.__dict__ | {}, "short": self.layout.short(),
                "step_seconds": self.time.step, "tokens_per_second": self.time.tokens_per_second,
                "mfu": self.time.mfu, "bubble_fraction": self.time.bubble_fraction,
                "time_terms": self.time.terms, "hidden_by_overlap": self.time.hidden,
                "peak_bytes": self.peak_bytes, "peak_stage": worst.stage,
                "memory_terms": worst.terms,
                "per_stage_bytes": [s.total for s in self.memory]}


@dataclass
class PlanResult:
    model: ModelSpec
    cluster: ClusterSpec
    global_batch: int
    ranked: list[Candidate] = field(default_factory=list)
    rejected: list[tuple[Layout, list[str]]] = field(default_factory=list)

    def table(self, top: int = 10) -> str:
        """The ``top`` fastest layouts, one line each, then how many were refused and why."""
        lines = [f"{self.model.name or 'model'} on {self.cluster.name or 'cluster'}, global batch "
                 f"{self.global_batch} x {self.model.seq_len} tokens: {len(self.ranked)} layouts "
                 f"fit, {len(self.rejected)} refused", "",
                 f"{'#':>3}  {'layout':<58} {'step s':>8} {'tok/s':>10} {'MFU':>5} "
                 f"{'GiB':>6}"]
        if not self.ranked:
            lines.append("  no layout fits: more GPUs, a smaller batch or more memory per GPU")
        for i, c in enumerate(self.ranked[:top]):
            lines.append(f"{i + 1:>3}  {c.layout.short():<58} {c.time.step:>8.3f} "
                         f"{c.time.tokens_per_second:>10.4g} {c.time.mfu:>5.1%} "
                         f"{c.peak_bytes / GIB:>6.1f}")
        if self.rejected:
            first: dict[str, str] = {}      # one example of each kind of first reason
            for layout, why in self.rejected:
                if _kind(why[0]) not in first:
                    first[_kind(why[0])] = f"  {layout.short()}: {why[0]}"
            lines += ["", "refused, e.g.:", *first.values()]
        return "\n".join(lines)

    def to_dict(self, top: int | None = None) -> dict:
        return {"model": self.model.__dict__ | {}, "cluster": self.cluster.name,
                "gpus": self.cluster.gpus, "memory_bytes": self.cluster.memory_bytes,
                "global_batch": self.global_batch, "fit": len(self.ranked),
                "refused": len(self.rejected),
                "ranked": [c.to_dict() for c in self.ranked[:top]],
                "refusals": [{"layout": l.short(), "reasons": why}
                             for l, why in self.rejected[:top]]}


def _kind(reason: str) -> str:
    return re.sub(r"[0-9.]+", "N", reason.split(" (")[0])


def prime_factors(n: int) -> dict[int, int]:
    """``{prime: exponent}`` of ``n`` >= 1 (n < ``MAX_GPUS``): 8e9 -> {2: 12, 5: 9}."""
    factors: dict[int, int] = {}
    p = 2
    while p * p <= n:                   # 2, then the odd numbers (composites never divide)
        while n % p == 0:
            factors[p] = factors.get(p, 0) + 1
            n //= p
        p += 1 if p == 2 else 2
    if n > 1:                           # what is left is prime
        factors[n] = factors.get(n, 0) + 1
    return factors


def divisors(n: int) -> list[int]:
    """Every divisor of ``n``, ascending, from its prime factors (never a loop up to n)."""
    out = [1]
    for p, e in prime_factors(n).items():
        out = [d * p**k for d in out for k in range(e + 1)]
    return sorted(out)


def check_reserve(cluster: ClusterSpec, reserve: float) -> None:
    """ValueError unless ``reserve`` bytes leave some of each GPU's memory: finite, >= 0, less."""
    if positive("reserve (bytes)", reserve, strict=False) >= cluster.memory_bytes:
        raise ValueError(f"reserve {reserve / GIB:.4g} GiB leaves nothing of the "
                         f"{cluster.memory_bytes / GIB:.4g} GiB per GPU")


def check_gpus(n: int) -> None:
    """ValueError when the layouts of ``n`` GPUs are too many to list (see ``MAX_GROUPINGS``)."""
    if n >= MAX_GPUS:
        raise ValueError(f"gpus={n}: the planner factorises GPU counts below 2**40")
    # (tp, pp, cp) whose product divides n: each prime of exponent e shares out at most e of
    # itself among three, in C(e + 3, 3) ways
    ways = math.prod(math.comb(e + 3, 3) for e in prime_factors(n).values())
    if ways > MAX_GROUPINGS:
        primes = " x ".join(f"{p}^{e}" if e > 1 else str(p) for p, e in prime_factors(n).items())
        raise ValueError(f"{n} GPUs = {primes} split into {ways} tp x pp x cp groupings, more "
                         f"than the planner weighs ({MAX_GROUPINGS}, each dozens of layouts); "
                         "a real cluster has a few thousand")


def plan(model: ModelSpec, cluster: ClusterSpec, global_batch: int, seq_len: int | None = None, *,
         mfu: float | None = None, microbatches: tuple[int, ...] = (1, 2, 4),
         zero_stages: tuple[int, ...] = (0, 1, 2, 3),
         recomputes: tuple[str, ...] = ("none", "selective", "full"),
         schedules: tuple[str, ...] = ("1f1b",), cp_sizes: tuple[int, ...] | None = None,
         reserve: float = 0.0, overlap: bool = True, dtype: str = "bf16") -> PlanResult:
    """Every layout of ``model`` (trained on ``seq_len``, its own by default) on ``cluster`` for
    ``global_batch`` sequences per step: the ones that fit ranked by predicted step time, the
    others with their reasons. ``cp_sizes``: context-parallel sizes to try (every divisor when
    None). ``reserve``: bytes per GPU left for the CUDA context, NCCL and fragmentation. ``mfu``:
    the fraction of peak every matmul reaches, an assumption; None takes compute from the GPU's
    measured curve (``layer_seconds``; h100 and h200 have one, a100 needs a number)."""
    whole("global_batch", global_batch)
    if mfu is not None:
        positive("mfu", mfu)
    check_reserve(cluster, reserve)
    if seq_len is not None:
        model = model.with_(seq_len=whole("seq_len", seq_len))
    budget = cluster.memory_bytes - reserve
    result = PlanResult(model, cluster, global_batch)
    n = cluster.gpus
    check_gpus(n)
    expert_sizes = divisors(model.experts)
    for tp, pp, cp in _groupings(n, cp_sizes):
        dp = n // (tp * pp * cp)
        eps = [e for e in expert_sizes if dp % e == 0] if model.experts > 1 else [1]
        for ep, mb, zero, rc, sched in product(eps, microbatches, zero_stages, recomputes,
                                               schedules):
            m, rest = divmod(global_batch, dp * mb)
            if rest or m == 0:
                if mb == microbatches[0] and zero == zero_stages[0] and rc == recomputes[0]:
                    result.rejected.append((Layout(tp, pp, dp, cp, ep, mb), [
                        f"global batch {global_batch} is not divisible by dp*microbatch = "
                        f"{dp}*{mb}"]))
                continue
            layout = Layout(tp, pp, dp, cp, ep, mb, m, sched, zero, rc,
                            dtype, chunks=2 if sched == "interleaved" else 1)
            problems = layout_problems(model, cluster, layout, global_batch)
            if problems:
                result.rejected.append((layout, problems))
                continue
            memory = memory_per_rank(model, layout)
            worst = max(memory, key=lambda s: s.total)
            if worst.total > budget:
                result.rejected.append((layout, [
                    f"needs {math.ceil(worst.total / GIB * 10) / 10:.1f} GiB > {budget / GIB:.4g} GiB "
                    f"(stage {worst.stage}: "
                    + ", ".join(f"{k} {v / GIB:.1f}" for k, v in worst.terms.items() if v)
                    + ")"]))
                continue
            result.ranked.append(Candidate(layout, memory, step_time(model, cluster, layout,
                                                                     mfu, overlap)))
    result.ranked.sort(key=lambda c: (c.time.step, c.peak_bytes))
    return result


def _groupings(n: int, cp_sizes: tuple[int, ...] | None):
    """(tp, pp, cp) whose product divides ``n``, in the order of ``product(divisors(n), ...)``."""
    every = divisors(n)
    for tp in every:
        after_tp = [d for d in every if (n // tp) % d == 0]       # divisors(n // tp)
        for pp in after_tp:
            rest = n // (tp * pp)
            for cp in cp_sizes or [d for d in after_tp if rest % d == 0]:
                if rest % cp == 0:
                    yield tp, pp, cp
