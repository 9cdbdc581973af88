"""A capstone rank copies each snapshot straight into the one flat tensor its result carries
(``parallel.snapshot(opt, out)``, ``state.pack_snapshots(snaps, flat)``), and the owner cuts it
back (``state.unpack``): the same bits, in the same order, as the optimizer's own state read after
every step (cloned here, independently of ``snapshot``)."""
from __future__ import annotations

import pytest
import torch

from mtb_helpers import run
from mtb_helpers.capstone.parallel import snapshot
from mtb_helpers.capstone.state import pack_snapshots, unpack
from mtb_helpers.dp.check import make_problem
from mtb_helpers.dp.fsdp import build_strategy
from mtb_helpers.dp.strategies import flat

KEYS = ("params", "exp_avg", "exp_avg_sq")


def _state(opt) -> dict:
    """What the optimizer holds now, cloned: the expected snapshot."""
    state = opt.optimizer.state[opt.master]
    return {"params": opt.flat[:opt.layout.numel].clone(), "exp_avg": state["exp_avg"].clone(),
            "exp_avg_sq": state["exp_avg_sq"].clone(), "own": tuple(opt.own), "step": int(state["step"])}


def _trained(strategy: str, steps: int):
    """A one-rank strategy through ``steps`` Adam steps, snapshotted as a rank does before the
    first and after every step, with the expected state read at the same moments."""
    model, _, batches = make_problem(4, 6, 10, torch.float64, seed=3, steps=steps)
    start = {"params": flat(model.parameters()), "step": 0}
    start.update(exp_avg=torch.zeros_like(start["params"]), exp_avg_sq=torch.zeros_like(start["params"]))
    opt = build_strategy(strategy, model, start)   # inside a rank: OverlappedDDP needs a group
    lo, hi = opt.own
    room = torch.empty((steps + 1) * (opt.layout.numel + 2 * (hi - lo)), dtype=torch.float64)
    cuts = iter(room.chunk(steps + 1))
    expected, taken = [_state(opt)], [snapshot(opt, next(cuts))]
    for x, y in batches:
        opt.train_step(x, y)
        expected.append(_state(opt))
        taken.append(snapshot(opt, next(cuts)))
    return expected, taken, room


@pytest.mark.parametrize("strategy", ["ddp", "zero1"])
def test_snapshots_packed_into_one_tensor_unpack_to_the_optimizers_state(strategy):
    [(expected, taken, room)] = run(_trained, strategy, 3, world_size=1)
    assert expected[1]["step"] == 1 and not torch.equal(expected[0]["params"], expected[-1]["params"])
    # written in place, in order: the tensor is the expected states one after another
    assert torch.equal(room, torch.cat([e[k] for e in expected for k in KEYS]))
    packed = pack_snapshots(taken, room)
    assert packed["flat"] is room
    n = len(expected[0]["params"])
    back = unpack({"params": {"names": ("w",), "shapes": [torch.Size([n])]}, "snapshots": packed})
    assert len(back["snapshots"]) == len(expected)
    for got, want in zip(back["snapshots"], expected):
        assert got["own"] == want["own"] and got["step"] == want["step"]
        assert all(torch.equal(got[k], want[k]) for k in KEYS)
    assert torch.equal(back["params"]["w"], expected[-1]["params"])


def test_a_zero1_shard_unpacks_with_its_own_sizes():
    """Under ZeRO-1 on dp > 1 a rank's moments are its shard, shorter than its parameters: the
    cuts must follow each piece's own length (equal lengths would hide a mix-up of the keys)."""
    from types import SimpleNamespace

    master = object()
    state = {"exp_avg": torch.arange(4.0) + 100, "exp_avg_sq": torch.arange(4.0) + 200, "step": 7}
    opt = SimpleNamespace(optimizer=SimpleNamespace(state={master: state}), master=master,
                          flat=torch.arange(12.0), layout=SimpleNamespace(numel=10), own=(4, 8))
    room = torch.empty(2 * (10 + 2 * 4))
    cuts = iter(room.chunk(2))
    taken = [snapshot(opt, next(cuts))]
    opt.flat, state["step"] = opt.flat + 1, 8
    taken.append(snapshot(opt, next(cuts)))
    back = unpack({"params": {"names": ("a", "b"), "shapes": [torch.Size([2, 3]), torch.Size([4])]},
                   "snapshots": pack_snapshots(taken, room)})
    for k, got in enumerate(back["snapshots"]):
        assert torch.equal(got["params"], torch.arange(10.0) + k) and got["step"] == 7 + k
        assert torch.equal(got["exp_avg"], state["exp_avg"]) and got["own"] == (4, 8)
        assert torch.equal(got["exp_avg_sq"], state["exp_avg_sq"])
    assert torch.equal(back["params"]["a"], (torch.arange(6.0) + 1).view(2, 3))
    assert torch.equal(back["params"]["b"], torch.arange(6.0, 10.0) + 1)
