"""Pipeline schedules: which op every stage runs, in which order.

A model of ``p`` layer blocks is split into ``p`` stages, one per rank; a batch is split into
``m`` micro-batches. Every stage runs a forward ``F`` and a backward ``B`` for every micro-batch;
zero-bubble schedules split ``B`` into the input-gradient op ``I`` (dX, which the previous stage
waits for) and the weight-gradient op ``W`` (dW, which nobody waits for)::

    from mtb_helpers.pp.schedules import schedule, simulate
    ops = schedule("1f1b", stages=4, microbatches=8)
    ops[2]                      # stage 2's ops in order: [F0, F1, B0, F2, B1, ...]
    timeline = simulate(ops, forward=1.0, backward=2.0)
    timeline.makespan, timeline.bubble_fraction, timeline.peak_activations

Orders follow the systems students can read next to this file:
  gpipe        Huang et al. 2019: all forwards, then all backwards in micro-batch order.
  1f1b         PipeDream-Flush (Narayanan et al., ICML 2021), Megatron-LM's plain schedule:
               min(p-r-1, m) warm-up forwards on stage r, then F/B alternating, then the cool-down.
  interleaved  Megatron-LM's interleaved 1F1B (Narayanan et al., SC 2021): rank r holds v = chunks
               model chunks (virtual stages r, r+p, r+2p, ...); forwards go in groups of p
               micro-batches per chunk; warm-up 2(p-r-1) + (v-1)p chunk forwards.
  zb-h1        Qi et al. 2023 handcrafted ZB-H1: 1F1B's warm-up, B replaced by I, and stage r
               lets r weight-gradient ops W wait, so W fills the slots where 1F1B idled.
"""
from __future__ import annotations

from mtb_helpers.pp.simulator import Op, Timeline, simulate

__all__ = ["Op", "Schedule", "SCHEDULES", "schedule", "simulate", "Timeline", "warmup_count",
           "closed_form"]

SCHEDULES: dict[str, str] = {
    "gpipe": "GPipe (Huang et al. 2019): all forwards, then all backwards",
    "1f1b": "1F1B / PipeDream-Flush (Narayanan et al., ICML 2021): warm-up, one F one B, cool-down",
    "interleaved": "interleaved 1F1B (Narayanan et al., SC 2021, Megatron-LM): v chunks per rank",
    "zb-h1": "ZB-H1 (Qi et al. 2023): backward split into input grad I and weight grad W",
}


class Schedule(list):
    """``ops[stage]`` is that stage's ordered list of :class:`Op`; also knows how it was made."""

    def __init__(self, per_stage: list[list[Op]], name: str, microbatches: int, chunks: int):
        super().__init__(per_stage)
        self.name = name
        self.stages = len(per_stage)
        self.microbatches = microbatches
        self.chunks = chunks

    def table(self) -> str:
        """One line per stage: ``stage r: F0 F1 B0 ...``; interleaved: ``rank r: F0c0 ...`` (a rank
        holds several virtual stages, so its line names the rank and each op its chunk)."""
        wide = self.chunks > 1
        row = "rank" if wide else "stage"
        return "\n".join(f"{row} {r}: " + " ".join(op.label(wide) for op in ops)
                         for r, ops in enumerate(self))


def _positive(**sizes: int) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _known(name: str) -> None:
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")


def warmup_count(name: str, stages: int, microbatches: int, stage: int, chunks: int = 2) -> int:
    """The warm-up forwards of stage ``stage``: those it runs before its steady phase (Megatron-LM's
    ``num_warmup_microbatches``).

    1f1b and zb-h1: min(p-r-1, m). interleaved: min(2(p-r-1) + (v-1)p, v m) chunk forwards
    (Megatron-LM). gpipe: all m. The steady phase opens with one more forward, so the stage runs
    ``warmup_count + 1`` forwards before its first backward (I for zb-h1), or all of them when the
    warm-up already ran every forward.
    """
    _known(name)
    p, m, r = stages, microbatches, stage
    if name == "gpipe":
        return m
    if name == "interleaved":
        return min(2 * (p - r - 1) + (chunks - 1) * p, chunks * m)
    return min(p - r - 1, m)


def _one_f_one_b(p: int, m: int, split_backward: bool) -> list[list[Op]]:
    stages = []
    for r in range(p):
        warm = warmup_count("1f1b", p, m, r)
        ops = [Op("F", i) for i in range(warm)]
        waiting_w: list[int] = []  # zb-h1: micro-batches whose I ran but whose W still waits
        for k in range(m):
            if k + warm < m:
                ops.append(Op("F", k + warm))
            if not split_backward:
                ops.append(Op("B", k))
                continue
            ops.append(Op("I", k))
            waiting_w.append(k)
            # Stage r keeps r weight-grad ops pending: stage r's I arrive r slots "late" relative
            # to the last stage, so its W fill exactly the slots 1F1B would leave idle.
            if len(waiting_w) > r:
                ops.append(Op("W", waiting_w.pop(0)))
        ops += [Op("W", i) for i in waiting_w]
        stages.append(ops)
    return stages


def _interleaved(p: int, m: int, v: int) -> list[list[Op]]:
    total = v * m  # chunk-level ops of each kind per rank

    def virtual(k: int, forward: bool) -> tuple[int, int]:
        # Megatron's order: the k-th chunk op of a rank belongs to group k // (p v); within a
        # group, p consecutive micro-batches per chunk; backwards walk the chunks in reverse.
        group, within = divmod(k, p * v)
        chunk = within // p
        return group * p + within % p, (chunk if forward else v - 1 - chunk)

    stages = []
    for r in range(p):
        warm = warmup_count("interleaved", p, m, r, v)
        ops = [Op("F", *virtual(k, True)) for k in range(warm)]
        for k in range(total - warm):
            ops.append(Op("F", *virtual(k + warm, True)))
            ops.append(Op("B", *virtual(k, False)))
        ops += [Op("B", *virtual(k, False)) for k in range(total - warm, total)]
        stages.append(ops)
    return stages


def schedule(name: str, stages: int, microbatches: int, chunks: int | None = None) -> Schedule:
    """Per-stage op order of pipeline schedule ``name`` ("gpipe", "1f1b", "interleaved", "zb-h1").

    ``chunks`` (v) is the number of model chunks per rank for "interleaved" (default 2, at least
    2; v = 1 is plain 1f1b) and must stay 1 (or None) for the others. Interleaved needs the
    micro-batch count to be a multiple of ``stages``, as the original Megatron-LM code required for
    its groups of p micro-batches per chunk (current Megatron-LM and torch.distributed.pipelining's
    ScheduleInterleaved1F1B relax it). Raises ValueError naming the bad argument.
    """
    _known(name)
    _positive(stages=stages, microbatches=microbatches, chunks=1 if chunks is None else chunks)
    if name == "interleaved":
        chunks = 2 if chunks is None else chunks
        if chunks < 2:
            raise ValueError("interleaved needs chunks >= 2 (with one chunk per rank it is 1f1b)")
        if microbatches % stages:
            raise ValueError(f"interleaved needs microbatches divisible by stages (Megatron-LM "
                             f"sends groups of p={stages} micro-batches through each chunk); "
                             f"got microbatches={microbatches}")
        return Schedule(_interleaved(stages, microbatches, chunks), name, microbatches, chunks)
    if chunks not in (None, 1):
        raise ValueError(f"chunks={chunks} only applies to the interleaved schedule")
    if name == "gpipe":   # all forwards, then all backwards in micro-batch order
        per_stage = [[Op(k, i) for k in "FB" for i in range(microbatches)] for _ in range(stages)]
    else:
        per_stage = _one_f_one_b(stages, microbatches, split_backward=(name == "zb-h1"))
    return Schedule(per_stage, name, microbatches, 1)


def closed_form(name: str, stages: int, microbatches: int, chunks: int = 1, forward: float = 1.0,
                backward: float = 2.0, input: float | None = None,
                weight: float | None = None) -> dict[str, float | str]:
    """The papers' bubble formulas for uniform stages, next to which the simulator is checked.

    Returns {"bubble_fraction": idle / (idle + busy), "bubble_ratio": idle / busy, "source",
    "exact"}. The ratio is the definition of Narayanan et al. SC 2021 ((p-1)/m); the fraction is the
    share of the makespan (GPipe's (p-1)/(m+p-1)). For zb-h1 (Qi et al. 2023) the idle time per
    stage is (p-1)(F + I - W); the simulator reproduces it exactly when m >= p and W <= min(F, I)
    (every deferred W then fits in a gap 1F1B would leave idle) and "exact" says so; outside that
    regime the simulated bubble is larger.
    """
    _known(name)
    _positive(stages=stages, microbatches=microbatches, chunks=chunks)
    p, m, v = stages, microbatches, chunks
    i = backward / 2 if input is None else input
    w = backward / 2 if weight is None else weight
    if name == "zb-h1":
        idle, busy = (p - 1) * max(forward + i - w, 0.0), m * (forward + i + w)
    else:   # only the interleaved schedule's v chunks shorten the fill and the drain
        idle = (p - 1) * (forward + backward) / (v if name == "interleaved" else 1)
        busy = m * (forward + backward)
    return {"bubble_fraction": idle / (idle + busy), "bubble_ratio": idle / busy,
            "source": _SOURCES[name], "exact": name != "zb-h1" or (m >= p and w <= min(forward, i))}


_SOURCES = {"gpipe": "Huang et al. 2019 (GPipe); Narayanan et al. ICML 2021",
            "1f1b": "Huang et al. 2019 (GPipe); Narayanan et al. ICML 2021",
            "interleaved": "Narayanan et al. SC 2021 (Megatron-LM, interleaved)",
            "zb-h1": "Qi et al. 2023 (Zero Bubble, ZB-H1)"}
