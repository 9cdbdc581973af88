"""The α-β model: how long a collective takes on a link of latency α and bandwidth β (how to call
it: :mod:`mtb_helpers.cost`).

Every algorithm costs ``T = a·α + b·n/β`` for a count of messages ``a`` on its critical path and
a fraction ``b`` of the size ``n`` that crosses the busiest link; ``coefficients`` holds the one
table of ``(a, b)`` (Thakur, Rabenseifner & Gropp 2005, "Optimization of collective communication
operations in MPICH", IJHPCA 19(1); γ, the reduction's arithmetic, is left out: on these sizes it
is memory-bound and small next to β). ``p`` ranks, ``L = ⌈lg p⌉``, ``p' = 2^⌊lg p⌋``:

    collective      algorithm         a (messages)  b (fraction of n)     n ("size", nccl-tests)
    all-reduce      ring              2(p-1)        2(p-1)/p              each rank's buffer
                    halving-doubling  2 lg p' (+2)  2(p'-1)/p' (+2)       Rabenseifner's algorithm
                    naive             2(p-1)        2(p-1)                reduce to rank 0, broadcast
    broadcast       ring              L + p-1       2(p-1)/p              the root's buffer
                    tree              L             L                     binomial tree
                    naive             p-1           p-1                   the root sends p-1 times
    all-gather      ring              p-1           (p-1)/p               the gathered output (p x input)
                    doubling          L             (p-1)/p               recursive doubling / Bruck
    reduce-scatter  ring              p-1           (p-1)/p               the full input (p x output)
                    halving           lg p' (+2)    (p'-1)/p' (+1 + 1/p)  recursive halving
    all-to-all      ring              p-1           (p-1)/p               each rank's send buffer
    send/recv       ring              1             1                     the message

"halving-doubling" is not NCCL's (double binary) tree: it moves the ring's bytes in fewer
messages, so at a power-of-two ``p`` it never loses to the ring (MPICH runs it for long messages).
(+...) is TRG's fold for a ``p`` that is not a power of two: the ``p - p'`` extra ranks hand their
whole vector to a partner first (one message of n) and get their result back last. The ring
broadcast is van de Geijn's scatter + ring all-gather (TRG's long-message broadcast); the ring
all-to-all is the pairwise exchange (step k: send to rank r+k, receive from r-k). One rank
(``p == 1``) sends nothing and takes no time.

``algbw`` and ``busbw`` are nccl-tests' (doc/PERFORMANCE.md): algbw = S/t with S the size above;
busbw = algbw x 2(p-1)/p (all-reduce), (p-1)/p (all-gather, reduce-scatter, all-to-all), 1
(broadcast, send/recv). For the ring all-reduce, all-gather, reduce-scatter and all-to-all busbw
tends to β as n grows: that is its point. Not for this ring broadcast: it moves 2(p-1)/p of n
through each link (scatter + all-gather) where nccl-tests' factor is 1, so its busbw tends to
β·p/(2(p-1)).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from mtb_helpers.runtime.errors import too_slow, years

__all__ = ["Link", "COLLECTIVES", "ALGORITHMS", "normalize", "coefficients", "predict",
           "algbw", "busbw", "busbw_factor", "n_half", "positive", "whole", "one_of"]

COLLECTIVES = ("broadcast", "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send/recv")
ALGORITHMS: dict[str, tuple[str, ...]] = {
    "broadcast": ("ring", "tree", "naive"), "all-reduce": ("ring", "halving-doubling", "naive"),
    "all-gather": ("ring", "doubling"), "reduce-scatter": ("ring", "halving"),
    "all-to-all": ("ring",), "send/recv": ("ring",)}
# torch.distributed's and comm/records' spellings of the same collectives, without "-" and "_"
_ALIASES = {c.replace("-", ""): c for c in COLLECTIVES}
_ALIASES |= dict.fromkeys(("send", "recv", "sendrecv", "p2p"), "send/recv")


def positive(name: str, value: object, strict: bool = True) -> float:
    """``value`` as a finite float > 0 (>= 0 unless ``strict``): Python's and numpy's ints and
    floats are numbers; bools are not."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):   # numpy's bool is not Real
        raise ValueError(f"{name} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (strict and number == 0):
        raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} 0, got {value!r}")
    return number


def whole(name: str, value: object, low: int = 1) -> int:
    """``value`` as an int >= ``low``: Python's or numpy's int; a bool is not one."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be {'a positive integer' if low == 1 else f'an int >= {low}'}, "
                         f"got {value!r}")
    return int(value)


def one_of(name: str, value: object, options) -> object:
    """``value`` if it is one of ``options`` (a tuple, or a dict's keys); a bool is never 0 or 1."""
    options = tuple(options)
    if isinstance(value, bool) or value not in options:
        raise ValueError(f"{name} must be one of {options}, got {value!r}")
    return value


@dataclass(frozen=True)
class Link:
    """A link between ranks: ``alpha`` seconds per message, ``bandwidth`` bytes per second.

    A message of n bytes takes ``alpha + n / bandwidth``. ``Link(5e-6, 50e9)`` is NVLink-like,
    ``Link(50e-6, 1e9)`` a slow network. Numbers may be Python's or numpy's. Refuses a bool, a
    non-finite, zero or negative value, and a link on which one message (α) or one byte (1/β)
    takes more than a year: its times would overflow a clock (ValueError naming it)."""
    alpha: float
    bandwidth: float

    def __post_init__(self) -> None:
        alpha, bandwidth = positive("alpha", self.alpha), positive("bandwidth", self.bandwidth)
        problem = too_slow(alpha, bandwidth)
        if problem:
            raise ValueError(problem)
        object.__setattr__(self, "alpha", alpha)
        object.__setattr__(self, "bandwidth", bandwidth)

    @property
    def n_half(self) -> float:
        """Bytes at which one message spends as long on α as on bytes: ``α·β``. Smaller messages
        are latency-bound, larger ones bandwidth-bound."""
        return self.alpha * self.bandwidth

    def time(self, collective: str, nbytes: int, world_size: int, algorithm: str = "ring") -> float:
        """``predict(collective, nbytes, world_size, self, algorithm)``: what the runtime asks."""
        return predict(collective, nbytes, world_size, self, algorithm)

    def describe(self) -> str:
        """E.g. ``'α = 5 µs, β = 50 GB/s'`` (for titles and tables)."""
        return f"α = {_si(self.alpha, 's')}, β = {_si(self.bandwidth, 'B/s')}"


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""), (1e-3, "m"),
                           (1e-6, "µ"), (1e-9, "n")):
        if value >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def normalize(collective: str) -> str:
    """The model's name for ``collective`` ("all_reduce", "allreduce", "send" -> "all-reduce",
    "all-reduce", "send/recv"); ValueError naming the known ones."""
    if not isinstance(collective, str):
        raise ValueError(f"collective must be a string, got {collective!r}")
    name = _ALIASES.get(collective.strip().lower().replace("_", "").replace("-", ""))
    if name is None:
        raise ValueError(f"unknown collective {collective!r}; expected one of {', '.join(COLLECTIVES)}")
    return name


def coefficients(collective: str, world_size: int, algorithm: str = "ring") -> tuple[float, float]:
    """``(a, b)`` with ``T = a·α + b·n/β`` (the table in this module's docstring)."""
    name, p = normalize(collective), whole("world_size", world_size)
    if algorithm not in ALGORITHMS[name]:
        raise ValueError(f"unknown algorithm {algorithm!r} for {name}; expected one of "
                         f"{', '.join(ALGORITHMS[name])}")
    if name == "send/recv":
        if p < 2:
            raise ValueError("send/recv needs world_size >= 2 (a sender and a receiver)")
        return 1.0, 1.0
    if p == 1:
        return 0.0, 0.0
    lg = math.ceil(math.log2(p))
    low = 2 ** int(math.floor(math.log2(p)))   # p': the power of two halving/doubling runs on
    fold = 0 if low == p else 1                 # TRG: extra ranks fold in first and out last
    table = {
        ("all-reduce", "ring"): (2 * (p - 1), 2 * (p - 1) / p),
        ("all-reduce", "halving-doubling"): (2 * math.log2(low) + 2 * fold, 2 * (low - 1) / low + 2 * fold),
        ("all-reduce", "naive"): (2 * (p - 1), 2 * (p - 1)),
        ("broadcast", "ring"): (lg + p - 1, 2 * (p - 1) / p),
        ("broadcast", "tree"): (lg, lg),
        ("broadcast", "naive"): (p - 1, p - 1),
        ("all-gather", "ring"): (p - 1, (p - 1) / p),
        ("all-gather", "doubling"): (lg, (p - 1) / p),
        ("reduce-scatter", "ring"): (p - 1, (p - 1) / p),
        ("reduce-scatter", "halving"): (math.log2(low) + 2 * fold,
                                     (low - 1) / low + fold * (1 + 1 / p)),
        ("all-to-all", "ring"): (p - 1, (p - 1) / p),
    }
    a, b = table[(name, algorithm)]
    return float(a), float(b)


def predict(collective: str, nbytes: int, world_size: int, link: Link,
            algorithm: str = "ring") -> float:
    """Seconds ``collective`` takes on ``world_size`` ranks joined by ``link`` for size ``nbytes``
    (nccl-tests' S: see the table above for what it counts), by ``algorithm``."""
    if not isinstance(link, Link):
        raise ValueError(f"link must be a Link(alpha, bandwidth), got {link!r}")
    a, b = coefficients(collective, world_size, algorithm)
    seconds = a * link.alpha + b * positive("nbytes", nbytes, strict=False) / link.bandwidth
    if math.isinf(seconds):
        raise ValueError(f"{normalize(collective)} ({algorithm}) of {nbytes:g} B on {world_size} "
                         f"ranks: this link would take {years(seconds)}")
    return seconds


def n_half(collective: str, world_size: int, link: Link, algorithm: str = "ring") -> float:
    """The size n at which the latency term equals the bandwidth term, ``(a/b)·α·β``: α·β for one
    message, p·α·β for the ring all-reduce (whose n is p times a ring step's); inf with one rank."""
    a, b = coefficients(collective, world_size, algorithm)
    return math.inf if b == 0 else a / b * link.n_half


def busbw_factor(collective: str, world_size: int) -> float:
    """nccl-tests' correction from algbw to busbw for ``collective`` on ``world_size`` ranks: the
    ring's ``b`` (the module docstring's table), except 1 for broadcast and send/recv."""
    name, p = normalize(collective), whole("world_size", world_size)
    return 1.0 if name in ("broadcast", "send/recv") else coefficients(name, p)[1]


def algbw(nbytes: int, seconds: float) -> float:
    """nccl-tests' algorithm bandwidth ``S / t`` in bytes per second."""
    return positive("nbytes", nbytes, strict=False) / positive("seconds", seconds)


def busbw(collective: str, nbytes: int, seconds: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth: ``algbw`` x ``busbw_factor`` (bytes per second)."""
    return algbw(nbytes, seconds) * busbw_factor(collective, world_size)
