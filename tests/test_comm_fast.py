"""The per-collective fast paths of ``comm``: ``issue`` calling a process group straight (only while
``torch.distributed``'s functions are its own), with the same bits and the same record."""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from mtb_helpers import comm, run
from mtb_helpers.comm.issue import _REDUCE_SCATTER

# what issue() looks up on torch.distributed: reduce_scatter_single in torch 2.13, the older
# reduce_scatter_tensor in 2.11 (Colab), where the reduce-scatter has no direct path
_WRAPPED = ("all_reduce", "all_gather", _REDUCE_SCATTER)


def _issue_all(wrap: bool):
    """On every rank, in a group of all ranks: an all-reduce, an all-gather along dims 0 and 1 and a
    reduce-scatter along dims 0 and 1 of float64 values whose sums round differently by order.
    ``wrap``: torch.distributed's functions replaced by counting wrappers first (as an emulated
    link or a test does); returns the results, the record and how often each wrapper ran."""
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
                outs = [comm.issue("all_reduce", x, region="t", direction="forward", group=group)]
                for op in ("all_gather", "reduce_scatter"):
                    for dim in (0, 1):
                        outs.append(comm.issue(op, x, region="t", direction="forward", dim=dim,
                                               group=group))
        finally:
            for name, fn in saved.items():
                setattr(dist, name, fn)
        return outs, [dataclasses.replace(e, seconds=None) for e in rec], calls
    return job


def test_issue_calls_the_group_straight_with_the_same_bits_and_record():
    direct = run(_issue_all(wrap=False), world_size=3)
    wrapped = run(_issue_all(wrap=True), world_size=3)
    for (outs, events, calls), (w_outs, w_events, w_calls) in zip(direct, wrapped):
        assert all(torch.equal(a, b) for a, b in zip(outs, w_outs))
        assert events == w_events and [e.op for e in events] == ["all_reduce"] + ["all_gather"] * 2 + [
            "reduce_scatter"] * 2
        assert calls == dict.fromkeys(_WRAPPED, 0)
        # replaced functions (an emulated link's) still see every op: the fast path steps aside
        assert w_calls == {"all_reduce": 1, "all_gather": 2, _REDUCE_SCATTER: 2}


def test_note_names_each_dtype():
    with comm.record() as rec:
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float32):
            comm.issue("all_reduce", torch.ones(2, dtype=dtype), region="t", direction="forward")
    assert [e.dtype for e in rec] == ["float32", "float64", "bfloat16", "float32"]
    assert [e.bytes for e in rec] == [8, 16, 4, 8]
