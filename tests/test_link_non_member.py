"""Under an emulated link, a collective on a group this rank is not in does what torch does
without a link: it warns and returns at once, the tensor untouched, while the members run it
(runtime/link_ops.py lets such a call through before it would queue it on the comm stream)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from mtb_helpers import run
from mtb_helpers.cost import Link


def _reduce_in_a_pair() -> list[float]:
    pair = dist.new_group([0, 1])   # rank 2 gets the non-member placeholder
    x = torch.full((4,), 10.0 * dist.get_rank() + 1, dtype=torch.float64)
    dist.all_reduce(x, group=pair)
    dist.barrier()
    dist.destroy_process_group(pair)
    return x.tolist()


def test_a_non_member_call_under_a_link_returns_as_without_one():
    plain = run(_reduce_in_a_pair, world_size=3, timeout=60)
    linked = run(_reduce_in_a_pair, world_size=3, timeout=60, link=Link(1e-3, 1e8), time_scale=1.0)
    assert plain == [[12.0] * 4, [12.0] * 4, [21.0] * 4]
    assert list(linked) == plain
    events = linked.timeline.events(kind="comm", name="all_reduce")
    assert {len(linked.timeline.events(rank=r, kind="comm", name="all_reduce")) for r in (0, 1)} == {1}
    assert not linked.timeline.events(rank=2, kind="comm", name="all_reduce") and len(events) == 2
