"""The α-β prediction of a data-parallel step that hides its communication (notebook 14).

Two lanes per rank, as on a GPU: compute (one kernel at a time) and communication (one collective
at a time, in the order they were issued; the comm stream). A step is a list of operations in
program order; each compute op starts when the compute lane is free and what it waits for is done,
each collective when it is issued and the comm lane is free, and takes ``cost.predict`` of its
bytes on the link. The model of the step then says everything the notebook measures:

* DDP (``predict_ddp``): layer ``i``'s backward takes ``t_bwd``, after which its gradients are
  ready; a bucket's all-reduce is issued when its last gradient is ready (``overlap=True``) or all
  of them after the backward (``overlap=False``). Step = forward + the later of the backward's end
  and the last bucket's end (``max(compute, comm)`` plus the exposed tail, exactly).
* ZeRO-1 (``zero1=True``): ``t_opt`` is still the whole model's optimizer time; the slowest rank
  steps the largest partition, so the step waits ``t_opt`` x its share of the bytes (about
  ``1/p``: whole parameters are assigned), then one all-gather of ``p`` x that partition.
* FSDP (``predict_fsdp``): each unit's all-gather before its forward and its backward, its
  reduce-scatter after its backward; with ``prefetch`` the next unit's all-gather is issued while
  the current one computes. All times in the link's seconds (no time scale).
"""
from __future__ import annotations

from dataclasses import dataclass

from mtb_helpers.dp.buckets import assign_buckets, bucket_cap_bytes

__all__ = ["LaneOp", "Prediction", "simulate", "predict_ddp", "predict_fsdp"]


@dataclass(frozen=True)
class LaneOp:
    """One operation of a step on one of the two lanes, in program order (``pp``'s ``Op`` is a
    stage's work on one micro-batch): ``kind`` "compute" or "comm"; ``after``: names of the ops it
    waits for (a compute op also waits for the compute lane, a collective for the comm lane)."""
    kind: str
    name: str
    seconds: float
    after: tuple[str, ...] = ()
    nbytes: int = 0


@dataclass(frozen=True)
class Prediction:
    """``events``: ``(kind, name, start, end, nbytes)`` per op; ``step``: when the last ends;
    ``compute`` and ``comm``: the busy time of each lane; ``exposed``: comm the compute did not hide."""
    events: list[tuple[str, str, float, float, int]]
    step: float
    compute: float
    comm: float

    @property
    def exposed(self) -> float:
        return self.step - self.compute


def simulate(ops: list[LaneOp]) -> Prediction:
    """Times of ``ops`` on the two lanes (see the module docstring)."""
    end: dict[str, float] = {}
    free = {"compute": 0.0, "comm": 0.0}
    issued = 0.0                    # a collective is issued by the program when it reaches it
    events = []
    for op in ops:
        ready = max([end[a] for a in op.after], default=0.0)
        if op.kind == "compute":
            start = max(free["compute"], ready)
            issued = start + op.seconds
        else:
            start = max(free["comm"], ready, issued)
        end[op.name] = start + op.seconds
        free[op.kind] = end[op.name]
        events.append((op.kind, op.name, start, end[op.name], op.nbytes))
    busy = {k: sum(e[3] - e[2] for e in events if e[0] == k) for k in free}
    return Prediction(events, max(end.values(), default=0.0), busy["compute"], busy["comm"])


def predict_ddp(layer_param_bytes: list[list[int]], t_fwd: float, t_bwd: float, link,
                world_size: int, bucket_cap_mb: float, overlap: bool = True, t_opt: float = 0.0,
                zero1: bool = False, largest_partition_bytes: int = 0) -> Prediction:
    """One DDP step (forward, backward, the bucket all-reduces, the optimizer) on the two lanes.
    ``layer_param_bytes[i]``: the bytes of layer ``i``'s parameters in registration order (one
    dtype). ``t_opt``: the optimizer's time for the whole model; with ``zero1`` the slowest rank
    takes ``t_opt * largest_partition_bytes / sum(bytes)`` (pass the whole model's ``t_opt``)."""
    from mtb_helpers.cost import predict
    if zero1 and not 0 < largest_partition_bytes <= sum(b for layer in layer_param_bytes for b in layer):
        raise ValueError("predict_ddp(zero1=True) needs largest_partition_bytes between 1 and the "
                         f"model's bytes, got {largest_partition_bytes!r}")
    p = world_size
    flat = [b for layer in layer_param_bytes for b in layer]
    layer_of = [i for i, layer in enumerate(layer_param_bytes) for _ in layer]
    ops = [LaneOp("compute", f"forward {i}", t_fwd) for i in range(len(layer_param_bytes))]
    # the wrapper's own rule (buckets.py), on byte counts: the predicted buckets are OverlappedDDP's
    buckets = assign_buckets(list(enumerate(flat)), bucket_cap_bytes(bucket_cap_mb))
    last_layer = [min(layer_of[j] for j in b) for b in buckets]   # backward goes last to first
    reduces, k = [], 0
    for i in reversed(range(len(layer_param_bytes))):
        ops.append(LaneOp("compute", f"backward {i}", t_bwd))
        while overlap and k < len(buckets) and last_layer[k] == i:
            reduces.append(k)
            ops.append(_all_reduce(k, buckets[k], flat, p, link, predict))
            k += 1
    for k in range(k, len(buckets)):
        ops.append(_all_reduce(k, buckets[k], flat, p, link, predict, after=("backward 0",)))
    waits = tuple(f"all-reduce bucket {k}" for k in range(len(buckets)))
    if t_opt:
        share = largest_partition_bytes / sum(flat) if zero1 else 1.0
        ops.append(LaneOp("compute", "optimizer", t_opt * share, waits))
    if zero1:
        gathered = p * largest_partition_bytes
        ops.append(LaneOp("comm", "all-gather partitions", predict("all-gather", gathered, p, link),
                      ("optimizer",) if t_opt else waits, gathered))
    return simulate(ops)


def _all_reduce(k, bucket, flat, p, link, predict, after=()) -> LaneOp:
    nbytes = sum(flat[j] for j in bucket)
    return LaneOp("comm", f"all-reduce bucket {k}", predict("all-reduce", nbytes, p, link), after, nbytes)


def predict_fsdp(unit_bytes: list[int], t_fwd: float, t_bwd: float, link, world_size: int,
                 prefetch: bool = True) -> Prediction:
    """Forward and backward of FSDP units (``unit_bytes``: each unit's full parameters in bytes,
    padded: what its all-gather fills and its reduce-scatter takes)."""
    from mtb_helpers.cost import predict
    p, n = world_size, len(unit_bytes)
    gather = lambda u, tag: LaneOp("comm", f"all-gather {u} {tag}",
                                   predict("all-gather", unit_bytes[u], p, link), (), unit_bytes[u])
    ops = [gather(0, "fwd")]
    for u in range(n):
        if prefetch and u + 1 < n:
            ops.append(gather(u + 1, "fwd"))
        elif not prefetch and u > 0:
            ops.append(_after(gather(u, "fwd"), f"forward {u - 1}"))
        ops.append(LaneOp("compute", f"forward {u}", t_fwd, (f"all-gather {u} fwd",)))
    ops.append(_after(gather(n - 1, "bwd"), f"forward {n - 1}"))
    for u in reversed(range(n)):
        if prefetch and u > 0:
            ops.append(gather(u - 1, "bwd"))
        elif not prefetch and u < n - 1:
            ops.append(_after(gather(u, "bwd"), f"backward {u + 1}"))
        ops.append(LaneOp("compute", f"backward {u}", t_bwd, (f"all-gather {u} bwd",)))
        ops.append(LaneOp("comm", f"reduce-scatter {u}", predict("reduce-scatter", unit_bytes[u], p, link),
                      (f"backward {u}",), unit_bytes[u]))
    return simulate(ops)


def _after(op: LaneOp, name: str) -> LaneOp:
    return LaneOp(op.kind, op.name, op.seconds, op.after + (name,), op.nbytes)
