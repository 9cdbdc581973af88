"""The ring's hops: several rings driven in lockstep share one message per round, each ring gets
its own tensor back and keeps its own record, and rings of different lengths (a bug's missing
hop) still finish."""
from __future__ import annotations

import torch

from mtb_helpers import run


def _two_rings():
    import torch.distributed as dist

    from mtb_helpers.comm.records import CollectiveRecord, record
    from mtb_helpers.cp.ring import Hop, drive

    r = dist.get_rank()

    def long_ring():     # two hops of float64 [2, 3]
        x = torch.full((2, 3), float(r), dtype=torch.float64)
        got = yield Hop(x, region="a", direction="forward")
        got = yield Hop(got * 10, region="a", direction="backward")
        return got

    def short_ring():    # one hop of int64 [5], then a value that is not a hop: no message
        got = yield Hop(torch.arange(5) + 100 * r, region="b", direction="forward")
        kept = yield got.sum()
        return got, kept

    sends, real = [], dist.isend

    def counted(*args, **kwargs):
        sends.append(1)
        return real(*args, **kwargs)

    dist.isend = counted
    try:
        mine = [CollectiveRecord(), CollectiveRecord()]
        with record() as outer:
            (a, (b, kept)) = drive([long_ring(), short_ring()], None, mine)
    finally:
        dist.isend = real
    return (a, b, kept, len(sends), [[(e.op, e.region, e.sent_bytes) for e in rec] for rec in mine],
            len(outer))


def test_rings_of_different_lengths_share_one_message_per_round():
    t = 3
    for r, (a, b, kept, sends, records, outer) in enumerate(run(_two_rings, world_size=t)):
        # a went two hops (r-2's value, times 10), b one hop (r-1's arange); kept came straight back
        assert torch.equal(a, torch.full((2, 3), 10.0 * ((r - 2) % t), dtype=torch.float64))
        assert torch.equal(b, torch.arange(5) + 100 * ((r - 1) % t)) and int(kept) == int(b.sum())
        assert sends == 2                                    # 2 rounds, not 3 messages
        assert records == [[("send", "a", 48), ("recv", "a", 0)] * 2,
                           [("send", "b", 40), ("recv", "b", 0)]]
        assert outer == 6                                    # an enclosing record sees every event
