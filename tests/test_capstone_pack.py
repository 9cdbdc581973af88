"""A capstone rank copies each snapshot straight into the one flat tensor its result carries
(``parallel.snapshot(opt, out)``, ``state.pack_snapshots(snaps, flat)``): the same bits, in the
same order, as cloning each snapshot and concatenating them."""
from __future__ import annotations

import pytest
import torch

from mtb_helpers.capstone.parallel import snapshot
from mtb_helpers.capstone.state import pack_snapshots, unpack
from mtb_helpers.dp.check import make_problem
from mtb_helpers.dp.fsdp import STRATEGY_CLASSES
from mtb_helpers.dp.strategies import flat


def _trained(strategy: str, steps: int):
    """A one-rank strategy after each of ``steps`` Adam steps: its snapshots both ways."""
    model, _, batches = make_problem(4, 6, 10, torch.float64, seed=3, steps=steps)
    start = {"params": flat(model.parameters()), "step": 0}
    start.update(exp_avg=torch.zeros_like(start["params"]), exp_avg_sq=torch.zeros_like(start["params"]))
    opt = STRATEGY_CLASSES[strategy](model, start)
    lo, hi = opt.own
    room = torch.empty((steps + 1) * (opt.layout.numel + 2 * (hi - lo)), dtype=torch.float64)
    cuts = iter(room.chunk(steps + 1))
    cloned, into = [snapshot(opt)], [snapshot(opt, next(cuts))]
    for x, y in batches:
        opt.train_step(x, y)
        cloned.append(snapshot(opt))
        into.append(snapshot(opt, next(cuts)))
    return cloned, into, room


@pytest.mark.parametrize("strategy", ["ddp", "zero1"])
def test_snapshots_copied_into_one_tensor_pack_to_the_same_bits(strategy):
    cloned, into, room = _trained(strategy, steps=3)
    for a, b in zip(cloned, into):
        assert a.keys() == b.keys() and a["own"] == b["own"] and a["step"] == b["step"]
        assert all(torch.equal(a[k], b[k]) for k in ("params", "exp_avg", "exp_avg_sq"))
    assert cloned[1]["step"] == 1 and not torch.equal(cloned[0]["params"], cloned[-1]["params"])
    packed, direct = pack_snapshots(cloned), pack_snapshots(into, room)
    assert direct["flat"] is room and torch.equal(packed["flat"], room)
    assert {k: v for k, v in packed.items() if k != "flat"} == {k: v for k, v in direct.items()
                                                                if k != "flat"}
    n = len(cloned[0]["params"])
    params = {"names": ("w",), "shapes": [torch.Size([n])]}
    back = unpack({"params": params, "snapshots": direct})
    assert torch.equal(back["params"]["w"], cloned[-1]["params"])


def test_pack_refuses_snapshots_that_do_not_tile_the_tensor():
    _, into, room = _trained("ddp", steps=2)
    with pytest.raises(ValueError, match="consecutive views"):
        pack_snapshots(into[::-1], room)         # out of order
    with pytest.raises(ValueError, match="consecutive views"):
        pack_snapshots(into[:-1], room)          # one missing: the tensor's end not reached
    with pytest.raises(ValueError, match="consecutive views"):
        pack_snapshots(into, room.clone())       # another tensor's copies
