"""The five collectives on real ranks, checked against one process, with the bytes each rank sends.

Notation: ``t`` ranks, ``n`` elements in the full (logical) tensor, ``V`` its size in bytes.

    broadcast       rank 0's [n] -> every rank's [n]
    all-reduce      every rank's [n] -> their sum [n] on every rank
    all-gather      rank r's shard [n/t] -> the concatenation [n] (shards in rank order) everywhere
    reduce-scatter  every rank's [n] -> rank r keeps chunk r of the sum, [n/t]
    all-to-all      rank r's [n] in t chunks -> chunk j goes to rank j; rank r gets [n] made of
                    chunk r of every rank, in rank order

Inputs are integer-valued (rank r holds ``10*r + d`` with a seeded digit d), so every result is
exact in float32 and float64: the check's tolerance is 0 and any difference is a bug.

Bytes sent are measured on Linux from the rank's own ``/proc/self/io`` (bytes its threads wrote to
gloo's TCP sockets), minus gloo's 48-byte header per message, and compared with the ring formulas.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

from mtb_helpers.bugs import validate_bug
from mtb_helpers.ranks import resolve_world_size, run

COLLECTIVES: tuple[str, ...] = ("broadcast", "all-reduce", "all-gather", "reduce-scatter",
                                "all-to-all")
# The bugs this module can inject, and the collective each one breaks (descriptions in bugs.py).
COLLECTIVE_BUGS: dict[str, str] = {
    "broadcast-wrong-root": "broadcast",
    "allreduce-lost-inplace": "all-reduce",
    "allgather-rank-order": "all-gather",
    "reduce-scatter-wrong-chunk": "reduce-scatter",
    "alltoall-wrong-split": "all-to-all",
}
FORMULAS: dict[str, str] = {
    "broadcast": "binomial tree: rank r sends V per child, the root ceil(log2 t)·V "
                 "(a pipelined ring: V per rank, 0 for the last)",
    "all-reduce": "2(t-1)/t·V",
    "all-gather": "(t-1)/t·V",
    "reduce-scatter": "(t-1)/t·V",
    "all-to-all": "(t-1)/t·V",
}
GLOO_HEADER_BYTES = 48   # gloo's TCP transport prefixes every message with six 8-byte fields
# Why a measurement can differ from its formula (shown when it does).
MEASURED_NOTES: dict[str, str] = {
    "reduce-scatter": "gloo has no ring reduce-scatter: it all-reduces the whole buffer and keeps "
                      "chunk r, so it sends 2(t-1)/t·V; NCCL's ring (and ring_reduce_scatter here) "
                      "sends (t-1)/t·V",
    "all-reduce": "gloo cuts a small buffer into uneven pieces, so ranks send a little more or "
                  "less than 2(t-1)/t·V; the total over ranks matches",
}

# ---------------------------------------------------------------- rank side (inside a rank)


def broadcast(x: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Inside a rank: ``x`` [n] -> rank ``src``'s [n] on every rank."""
    out = x.clone()
    dist.broadcast(out, src=src)
    return out


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Inside a rank: ``x`` [n] -> the sum over ranks [n]. all_reduce works in place."""
    out = x.clone()
    dist.all_reduce(out)
    return out


def all_gather(x: torch.Tensor) -> torch.Tensor:
    """Inside a rank: this rank's shard [n/t] -> every shard, in rank order [n]."""
    out = x.new_empty(x.numel() * dist.get_world_size())
    # torch 2.13 renamed all_gather_into_tensor; Colab's older torch only has the old name.
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, x.contiguous())
    return out


def reduce_scatter(x: torch.Tensor) -> torch.Tensor:
    """Inside a rank: ``x`` [n] -> chunk ``rank`` of the sum over ranks [n/t]."""
    t, rank = dist.get_world_size(), dist.get_rank()
    out = x.new_empty(x.numel() // t)
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    try:
        fn(out, x.contiguous())
    except RuntimeError as exc:  # older gloo builds have no reduce-scatter: the same result
        if "support" not in str(exc):
            raise
        total = x.clone()
        dist.all_reduce(total)
        out = total.chunk(t)[rank].clone()
    return out


def all_to_all(x: torch.Tensor) -> torch.Tensor:
    """Inside a rank: ``x`` [n] as t chunks [n/t]; chunk j goes to rank j. Returns [n]: chunk
    ``rank`` of every rank, in rank order (a transpose of the [t, t] grid of chunks)."""
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x.contiguous())
    return out


RANK_FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "broadcast": broadcast, "all-reduce": all_reduce, "all-gather": all_gather,
    "reduce-scatter": reduce_scatter, "all-to-all": all_to_all}


def ring_all_gather(x: torch.Tensor) -> torch.Tensor:
    """Inside a rank: all-gather [n/t] -> [n] from point-to-point messages around a ring.

    In step s every rank passes the shard it received last (its own at s=0) to rank r+1 and
    receives a new one from rank r-1: t-1 steps of n/t elements, so (t-1)/t·V bytes sent."""
    t, rank = dist.get_world_size(), dist.get_rank()
    shards = [torch.empty_like(x) for _ in range(t)]
    shards[rank] = x.clone()
    for step in range(t - 1):
        send_idx, recv_idx = (rank - step) % t, (rank - step - 1) % t
        req = dist.isend(shards[send_idx], dst=(rank + 1) % t)
        dist.recv(shards[recv_idx], src=(rank - 1) % t)
        req.wait()
    return torch.cat(shards)


def ring_reduce_scatter(x: torch.Tensor) -> torch.Tensor:
    """Inside a rank: reduce-scatter [n] -> [n/t] around a ring, the way NCCL does it.

    Chunk k starts on rank k+1 and travels t-1 hops, each rank adding its own chunk k, so it
    ends summed on rank k: t-1 messages of n/t elements, (t-1)/t·V bytes sent."""
    t, rank = dist.get_world_size(), dist.get_rank()
    chunks = [c.clone() for c in x.chunk(t)]
    for step in range(t - 1):
        send_idx, recv_idx = (rank - step - 1) % t, (rank - step - 2) % t
        incoming = torch.empty_like(chunks[recv_idx])
        req = dist.isend(chunks[send_idx], dst=(rank + 1) % t)
        dist.recv(incoming, src=(rank - 1) % t)
        req.wait()
        chunks[recv_idx] += incoming
    return chunks[rank]


# The deliberate mistakes: each one a realistic slip in calling the collective.
def _broadcast_wrong_root(x):
    return broadcast(x, src=dist.get_world_size() - 1)


def _allreduce_lost_inplace(x):
    dist.all_reduce(x.clone())  # reduces a temporary; the caller's tensor is never updated
    return x.clone()


def _allgather_rank_order(x):
    t, rank = dist.get_world_size(), dist.get_rank()
    shards = list(all_gather(x).chunk(t))
    return torch.cat(shards[rank:] + shards[:rank])  # arrival order, own shard first


def _reduce_scatter_wrong_chunk(x):
    chunks = list(x.chunk(dist.get_world_size()))
    return reduce_scatter(torch.cat(chunks[1:] + chunks[:1]))  # rank r gets chunk r+1


def _alltoall_wrong_split(x):
    t = dist.get_world_size()
    return all_to_all(x.view(-1, t).t().reshape(-1))  # element i goes to rank i % t


_BUGGY: dict[str, Callable] = {
    "broadcast-wrong-root": _broadcast_wrong_root,
    "allreduce-lost-inplace": _allreduce_lost_inplace,
    "allgather-rank-order": _allgather_rank_order,
    "reduce-scatter-wrong-chunk": _reduce_scatter_wrong_chunk,
    "alltoall-wrong-split": _alltoall_wrong_split,
}

# ---------------------------------------------------------------- the single-process side


def input_numel(collective: str, world_size: int, numel: int) -> int:
    """Elements in each rank's input: the shard n/t for all-gather, the full n otherwise."""
    return numel // world_size if collective == "all-gather" else numel


def rank_input(collective: str, rank: int, world_size: int, numel: int,
               dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    """Rank ``rank``'s input for ``collective``: ``10*rank + d`` with seeded digits d in 0..9, so
    the tens digit names the rank it came from and every sum stays exact."""
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    digits = torch.randint(0, 10, (input_numel(collective, world_size, numel),), generator=gen)
    return (10 * rank + digits).to(dtype)


def reference(collective: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """What every rank must hold after ``collective``, computed in one process from all inputs."""
    t = len(inputs)
    if collective == "broadcast":
        return [inputs[0].clone() for _ in range(t)]
    if collective == "all-gather":
        return [torch.cat(inputs) for _ in range(t)]
    if collective == "all-to-all":
        return [torch.cat([x.chunk(t)[r] for x in inputs]) for r in range(t)]
    total = torch.stack(inputs).sum(dim=0)
    if collective == "all-reduce":
        return [total.clone() for _ in range(t)]
    return [c.clone() for c in total.chunk(t)]  # reduce-scatter


def _tree_children(rank: int, world_size: int) -> int:
    # Binomial tree rooted at 0 (gloo's broadcast): rank r forwards to r + 2^k for 2^k > r.
    return sum(1 for k in range(world_size.bit_length())
               if 2 ** k > rank and rank + 2 ** k < world_size)


def formula_bytes(collective: str, world_size: int, nbytes: float) -> list[float]:
    """Bytes each rank sends by the textbook algorithm; ``nbytes`` = V, the full tensor's bytes
    (all-gather's output, reduce-scatter's input). Rings for all but broadcast (binomial tree)."""
    t = world_size
    if collective == "broadcast":
        return [float(nbytes * _tree_children(r, t)) for r in range(t)]
    factor = 2 if collective == "all-reduce" else 1  # all-reduce = reduce-scatter + all-gather
    return [factor * (t - 1) / t * nbytes] * t


def ring_broadcast_bytes(world_size: int, nbytes: float) -> list[float]:
    """A pipelined ring broadcast: every rank but the last forwards V once."""
    return [float(nbytes)] * (world_size - 1) + [0.0]


def decode_sources(tag: float, world_size: int) -> list[int]:
    """The ranks whose data reached a cell: bit r of the provenance tag (see ``_on_rank``)."""
    if tag != int(tag) or not 0 < tag < 2 ** world_size:
        return []
    return [r for r in range(world_size) if int(tag) >> r & 1]


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


def _device() -> torch.device:
    if dist.get_backend() == "nccl":  # under torchrun on GPUs
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _on_rank(collectives: tuple[str, ...], numel: int, dtype: torch.dtype, seed: int,
             bug: str | None, implementations: dict, keep_values: bool = True) -> dict:
    rank, t = dist.get_rank(), dist.get_world_size()
    results = {}
    for name in collectives:
        fn = implementations.get(name) or RANK_FUNCTIONS[name]
        if bug is not None and COLLECTIVE_BUGS[bug] == name:
            fn = _BUGGY[bug]
        x = rank_input(name, rank, t, numel, dtype, seed).to(_device())
        out, sent = measure(fn, x)
        res = {"bytes": sent}
        if keep_values:
            # Provenance: every element of rank r carries 2^r; summed cells carry several bits.
            tags = fn(torch.full_like(x, 2.0 ** rank))
            res.update(before=x.cpu(), after=out.cpu(), tags=tags.cpu())
        results[name] = res
    return results


# ---------------------------------------------------------------- the check and its report


@dataclass
class CollectivesReport:
    """Per (collective, rank): the buffer before and after, the expected one, the max abs error
    (tolerance 0: inputs are integers) and the bytes sent, measured and by the formula."""

    world_size: int
    numel: int
    dtype: str
    seed: int
    bug: str | None
    rows: list[dict] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(row["passed"] for row in self.rows)

    def rows_for(self, collective: str) -> list[dict]:
        return [row for row in self.rows if row["collective"] == collective]

    @property
    def notes(self) -> list[str]:
        """One line per collective whose measured bytes differ from the formula, saying why."""
        off = {r["collective"] for r in self.rows if r["bytes_measured"] is not None
               and abs(r["bytes_measured"] - r["bytes_formula"]) > 0.01 * r["V_bytes"]}
        return [f"{name}: {MEASURED_NOTES.get(name, 'measured bytes differ from the formula')}"
                for name in COLLECTIVES if name in off]

    def to_dict(self) -> dict:
        return {"check": "collectives", "world_size": self.world_size, "numel": self.numel,
                "dtype": self.dtype, "seed": self.seed, "bug": self.bug, "passed": self.passed,
                "formulas": dict(FORMULAS), "notes": self.notes,
                "rows": [dict(row) for row in self.rows]}

    def _table(self) -> tuple[list[str], list[list[str]]]:
        head = ["collective", "rank", "before", "after", "max abs err", "sent (measured)",
                "sent (formula)", "result"]
        body = [[r["collective"], str(r["rank"]), _short_list(r["before"]),
                 _short_list(r["after"]), f"{r['max_abs_error']:.3g}", _bytes(r["bytes_measured"]),
                 _bytes(r["bytes_formula"]), "PASS" if r["passed"] else "FAIL"] for r in self.rows]
        return head, body

    def _title(self) -> str:
        verdict = "PASSED" if self.passed else "FAILED"
        return (f"collectives check, {self.world_size} ranks, numel={self.numel}, {self.dtype}, "
                f"seed={self.seed}, bug={self.bug}: {verdict}")

    def __str__(self) -> str:
        head, body = self._table()
        widths = [max(len(x) for x in col) for col in zip(head, *body)]
        fmt = "  ".join(f"{{:{'<' if i < 4 else '>'}{w}}}" for i, w in enumerate(widths))
        notes = [f"note: {n}" for n in self.notes]
        return "\n".join([self._title(), fmt.format(*head)] + [fmt.format(*b) for b in body]
                         + notes)

    def _repr_html_(self) -> str:
        head, body = self._table()
        cells = "".join(f"<th>{h}</th>" for h in head)
        rows = "".join(
            "<tr>" + "".join(f"<td>{c}</td>" for c in b[:-1])
            + f"<td style='color:{'#009E73' if b[-1] == 'PASS' else '#D55E00'}'><b>{b[-1]}</b></td></tr>"
            for b in body)
        notes = "".join(f"<p><i>note: {n}</i></p>" for n in self.notes)
        return f"<p><b>{self._title()}</b></p><table><tr>{cells}</tr>{rows}</table>{notes}"


def _short_list(values: list[float], keep: int = 6) -> str:
    text = ", ".join(f"{v:g}" for v in values[:keep])
    return f"[{text}{', …' if len(values) > keep else ''}]"


def _bytes(n: float | None) -> str:
    return "n/a" if n is None else f"{n:,.0f} B"


def _dtype(dtype: torch.dtype | str) -> torch.dtype:
    allowed = {"float32": torch.float32, "float64": torch.float64}
    if isinstance(dtype, str) and dtype in allowed:
        return allowed[dtype]
    if dtype in allowed.values():
        return dtype
    raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")


def _validate(world_size: int, numel: int, collectives: tuple[str, ...], bug: str | None,
              seed: int) -> None:
    for name in collectives:
        if name not in COLLECTIVES:
            raise ValueError(f"unknown collective {name!r}; expected one of {COLLECTIVES}")
    if not isinstance(numel, int) or isinstance(numel, bool) or numel < 1:
        raise ValueError(f"numel must be a positive int, got {numel!r}")
    if numel % world_size:
        raise ValueError(f"numel={numel} (the full tensor) must be divisible by the world size "
                         f"{world_size}: each rank's chunk is numel/t elements")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    validate_bug(bug, tuple(COLLECTIVE_BUGS))
    if bug is not None:
        if COLLECTIVE_BUGS[bug] not in collectives:
            raise ValueError(f"bug {bug!r} breaks {COLLECTIVE_BUGS[bug]}, which is not checked")
        if world_size < 2 or (bug == "alltoall-wrong-split" and numel // world_size < 2):
            raise ValueError(f"bug {bug!r} cannot show with {world_size} rank(s) and numel={numel}"
                             ": use 2 or more ranks (and 2 or more elements per chunk)")


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
    dtype = _dtype(dtype)
    _validate(world_size, numel, collectives, bug, seed)
    results = run(_on_rank, collectives, numel, dtype, seed, bug, dict(implementations or {}),
                  world_size=world_size, timeout=timeout)
    report = CollectivesReport(world_size, numel, str(dtype).replace("torch.", ""), seed, bug)
    for name in collectives:
        inputs = [rank_input(name, r, world_size, numel, dtype, seed) for r in range(world_size)]
        nbytes = numel * inputs[0].element_size()
        for r, (want, formula) in enumerate(zip(reference(name, inputs),
                                                formula_bytes(name, world_size, nbytes))):
            got = results[r][name]
            same_shape = got["after"].shape == want.shape
            err = (got["after"] - want).abs().max().item() if same_shape and want.numel() else 0.0
            err = err if same_shape else float("inf")
            report.rows.append({
                "collective": name, "rank": r, "V_bytes": nbytes,
                "before": got["before"].tolist(), "after": got["after"].tolist(),
                "expected": want.tolist(),
                "sources": [decode_sources(v, world_size) for v in got["tags"].tolist()],
                "max_abs_error": err, "tolerance": 0.0, "passed": err == 0.0,
                "bytes_measured": got["bytes"], "bytes_formula": formula})
    return report


# ---------------------------------------------------------------- bytes, decomposition, deadlock


def measure_bytes(world_sizes: tuple[int, ...] = (1, 2, 3, 4), numel: int = 12 * 1024,
                  collectives: tuple[str, ...] = COLLECTIVES, dtype: torch.dtype | str = torch.float32,
                  timeout: float = 60.0) -> list[dict]:
    """Bytes each rank sends per collective at each world size, measured next to the formula.
    Rows: collective, world_size, rank, V_bytes, measured (None off Linux), formula. ``numel`` must
    divide by every world size; 12288 float32 (48 KiB) does for 1..4 and makes headers negligible."""
    dtype = _dtype(dtype)
    for t in world_sizes:
        _validate(resolve_world_size(t), numel, tuple(collectives), None, 0)
    rows = []
    for t in world_sizes:
        results = run(_on_rank, tuple(collectives), numel, dtype, 0, None, {}, False,
                      world_size=t, timeout=timeout)
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
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
    dtype = _dtype(dtype)
    _validate(world_size, numel, COLLECTIVES, None, seed)
    ranks = run(_decompose_on_rank, numel, dtype, seed, world_size=world_size, timeout=timeout)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    return {"passed": all(r["max_abs_difference"] == 0 for r in ranks), "V_bytes": nbytes,
            "world_size": world_size, "ranks": ranks,
            "formula": {"all-reduce": formula_bytes("all-reduce", world_size, nbytes)[0],
                        "reduce-scatter": formula_bytes("reduce-scatter", world_size, nbytes)[0],
                        "all-gather": formula_bytes("all-gather", world_size, nbytes)[0]}}


def skip_a_collective() -> torch.Tensor:
    """Inside a rank: every rank but the last calls all_reduce; the last one returns early, so the
    others wait for a partner that never comes (gloo's default timeout is 30 minutes)."""
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
