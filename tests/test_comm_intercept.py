"""The one interception point (runtime/link_ops.py): records observe ``torch.distributed`` from below.

A student's own ``dist.all_reduce`` is recorded like a region's; functions someone replaced before
(a test, a profiler) still run underneath, with the same bits and the same record; calls torch makes
inside its own functions are not recorded; with nobody observing, torch's functions are untouched.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from mtb_helpers import comm, run
from mtb_helpers.comm.records import note
from mtb_helpers.comm.regions import _ALL_GATHER, _REDUCE_SCATTER
from mtb_helpers.runtime import link_ops as intercept

_WRAPPED = ("all_reduce", _ALL_GATHER, _REDUCE_SCATTER)


def _issue_all(wrap: bool):
    """On every rank: an all-reduce, then an all-gather and a reduce-scatter of dim 0 and of dim 1
    (moved to the front) of float64 values whose sums round differently by order.
    ``wrap``: torch.distributed's functions replaced by counting wrappers first (as a test or a
    profiler does); returns the results, the record and how often each wrapper ran."""
    def job():
        group = dist.new_group(list(range(dist.get_world_size())))
        r = dist.get_rank()
        gen = torch.Generator().manual_seed(r)
        x = torch.randn(6, 6, generator=gen, dtype=torch.float64) * 10.0 ** torch.arange(6.0)
        calls = dict.fromkeys(_WRAPPED, 0)
        saved = {name: getattr(dist, name) for name in _WRAPPED}

        def counting(name):
            def wrapper(*args, **kwargs):
                calls[name] += 1
                return saved[name](*args, **kwargs)
            return wrapper
        if wrap:
            for name in _WRAPPED:
                setattr(dist, name, counting(name))
        try:
            with comm.record() as rec:
                t = dist.get_world_size(group)
                total = x.clone()
                dist.all_reduce(total, group=group)
                outs = [total]
                for dim in (0, 1):
                    rows = x.movedim(dim, 0).contiguous()                  # [6, 6]
                    gathered = rows.new_empty((t * 6, 6))
                    getattr(dist, _ALL_GATHER)(gathered, rows, group=group)   # -> [6t, 6]
                    mine = rows.new_empty((6 // t, 6))
                    getattr(dist, _REDUCE_SCATTER)(mine, rows, group=group)   # -> [6/t, 6]
                    outs += [gathered, mine]
            restored = all(getattr(dist, n) is (saved[n] if not wrap else calls and getattr(dist, n))
                           for n in _WRAPPED)
        finally:
            for name, fn in saved.items():
                setattr(dist, name, fn)
        return outs, [dataclasses.replace(e, seconds=None) for e in rec], calls, restored
    return job


def test_replaced_functions_still_run_under_the_record_with_the_same_bits_and_record():
    plain = run(_issue_all(wrap=False), world_size=3)
    wrapped = run(_issue_all(wrap=True), world_size=3)
    for (outs, events, calls, restored), (w_outs, w_events, w_calls, _) in zip(plain, wrapped):
        assert all(torch.equal(a, b) for a, b in zip(outs, w_outs))
        assert events == w_events and [e.op for e in events] == ["all_reduce"] + [
            "all_gather", "reduce_scatter"] * 2               # each once, none twice
        assert w_calls == {"all_reduce": 1, _ALL_GATHER: 2, _REDUCE_SCATTER: 2}
        assert restored                                       # torch's functions back after the block


def _students_own_calls() -> dict:
    t = dist.get_world_size()
    before = dist.all_reduce is intercept.ORIG["all_reduce"]
    with comm.record() as rec:
        during = dist.all_reduce is not intercept.ORIG["all_reduce"]
        x = torch.ones(5, 4)
        dist.all_reduce(x)                                    # [5, 4] -> sum over ranks
        parts = [torch.empty(3) for _ in range(t)]
        dist.all_gather(parts, torch.full((3,), float(dist.get_rank())))
        if dist.get_rank() == 0:
            dist.send(torch.ones(7), dst=1)
        elif dist.get_rank() == 1:
            dist.recv(torch.empty(7), src=0)
        objects = [None] * t
        dist.all_gather_object(objects, {"rank": dist.get_rank()})   # torch's own inner calls
    after = dist.all_reduce is intercept.ORIG["all_reduce"]
    return {"events": [(e.op, e.region, e.direction, e.shape, e.out_shape, e.bytes, e.sent_bytes)
                       for e in rec], "x": x, "parts": parts, "objects": objects,
            "patched": (before, during, after)}


def test_a_students_own_torch_distributed_calls_are_recorded_with_no_region():
    t = 3
    for r, res in enumerate(run(_students_own_calls, world_size=t)):
        assert res["patched"] == (True, True, True)          # patched only while recording
        assert torch.equal(res["x"], torch.full((5, 4), float(t)))
        assert [int(p[0]) for p in res["parts"]] == list(range(t))
        assert res["objects"] == [{"rank": q} for q in range(t)]
        want = [("all_reduce", "", "", (5, 4), (5, 4), 80, 2 * (t - 1) * 80 // t),
                ("all_gather", "", "", (3,), (t, 3), 12, (t - 1) * 12)]
        want += {0: [("send", "", "", (7,), (7,), 28, 28)],
                 1: [("recv", "", "", (7,), (7,), 28, 0)]}.get(r, [])
        assert res["events"] == want, r                       # all_gather_object's: not recorded


def test_note_names_each_dtype():
    with comm.record() as rec:
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float32):
            x = torch.ones(2, dtype=dtype)
            note("all_reduce", x, x, "t", "", "forward", 1)   # one process: nothing to issue
    assert [e.dtype for e in rec] == ["float32", "float64", "bfloat16", "float32"]
    assert [e.bytes for e in rec] == [8, 16, 4, 8]


def _linked_region():
    x = torch.ones(4, 8, requires_grad=True)
    with comm.record() as rec:
        y = comm.reduce_from_tensor_model_parallel_region(comm.copy_to_tensor_model_parallel_region(x))
        y.sum().backward()
    return [(e.op, e.operator, e.direction) for e in rec], x.grad


def test_one_interception_serves_an_emulated_link_and_the_record_together():
    """Under a link each region's collective is recorded once and takes its modelled time once."""
    from mtb_helpers.cost import Link
    out = run(_linked_region, world_size=2, link=Link(alpha=2e-3, bandwidth=1e8), time_scale="auto")
    for r, (events, grad) in enumerate(out):
        assert events == [("all_reduce", "g", "forward"), ("all_reduce", "f", "backward")]
        assert torch.equal(grad, torch.full((4, 8), 2.0))
        assert [e.name for e in out.timeline.events(rank=r, kind="comm")] == ["all_reduce"] * 2
        assert all(e.seconds >= e.modelled for e in out.timeline.events(rank=r, kind="comm"))


def test_the_lesson_regions_call_torch_distributed_themselves():
    """What notebooks 01-04 print: f's backward, g's forward and the sequence-parallel pair hold
    the torch.distributed call itself, not a course function."""
    import inspect
    from mtb_helpers.comm import regions
    calls = {regions._CopyToModelParallelRegion.backward: "dist.all_reduce(",
             regions._ReduceFromModelParallelRegion.forward: "dist.all_reduce(",
             regions._GatherFromSequenceParallelRegion.forward: "getattr(dist, _ALL_GATHER)(",
             regions._GatherFromSequenceParallelRegion.backward: "getattr(dist, _REDUCE_SCATTER)("}
    for fn, call in calls.items():
        assert call in inspect.getsource(fn), fn
    assert "issue(" not in inspect.getsource(regions)
