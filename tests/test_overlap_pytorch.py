"""The course's wrappers against PyTorch's on the same ranks, step for step, and against one process
on the whole batch (float64 where the dtype allows)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from mtb_helpers import run
from mtb_helpers.dp.overlap_pytorch import pytorch_overlap

SCRIPT = Path(__file__).parent / "scripts" / "overlap_train.py"


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("cap", [0.0, 0.0004, 0.002, 25.0])
def test_overlapped_ddp_equals_distributed_data_parallel_with_the_same_buckets(optimizer, cap):
    res = pytorch_overlap(world_size=2, wrapper="ddp", optimizer=optimizer, steps=5, bucket_cap_mb=cap)
    assert len(res["max_diff"]["course vs pytorch"]) == 5
    assert max(res["max_diff"]["course vs pytorch"]) <= 1e-15
    assert max(res["max_diff"]["course vs one process"]) <= 1e-13
    assert res["buckets"]["course"] == res["buckets"]["pytorch"]   # DDP's rebuilt buckets
    assert len(res["buckets"]["course"]) == {0.0: 6, 0.0004: 3, 0.002: 2, 25.0: 1}[cap]


def test_pytorch_s_ddp_is_never_given_a_cap_of_zero(monkeypatch):
    """torch 2.11 (Colab) refuses DistributedDataParallel(bucket_cap_mb=0); the course's cap of 0 (one
    bucket per parameter) reaches DDP as one byte, which buckets the same way (the test above)."""
    import torch.nn.parallel
    from mtb_helpers.dp import overlap_pytorch

    given = []

    class Recorder:   # stands in for DDP: only the cap it is built with matters here
        def __init__(self, module, bucket_cap_mb=None):
            given.append(bucket_cap_mb)

        def register_comm_hook(self, state, hook):
            pass

    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", Recorder)
    for cap in (0.0, 0, 0.0004, 25.0):
        overlap_pytorch._ddp(torch.nn.Linear(2, 2), cap)
    assert given[:2] == [2.0 ** -20] * 2 and int(given[0] * 2 ** 20) == 1   # one byte, not 0
    assert given[2:] == [0.0004, 25.0]                                       # a real cap as given
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="bucket_cap_mb"):
            pytorch_overlap(world_size=2, bucket_cap_mb=bad)


def test_the_buckets_follow_the_cap_as_pytorch_forms_them():
    res = pytorch_overlap(world_size=2, wrapper="ddp", optimizer="sgd", steps=2, bucket_cap_mb=0.002)
    # 4.bias 64 B + 4.weight 512 + 2.bias 64 stay under 2097 B; 2.weight (2048 B) joins and closes
    assert res["buckets"]["course"] == [["4.bias", "4.weight", "2.bias", "2.weight"],
                                        ["0.bias", "0.weight"]]


def test_sharded_optimizer_equals_zero_redundancy_optimizer_and_the_unsharded_one():
    res = pytorch_overlap(world_size=2, wrapper="zero1", optimizer="adamw", steps=10)
    diff = res["max_diff"]
    assert len(diff["course vs pytorch"]) == 10
    assert max(diff["course vs pytorch"]) <= 1e-15 and max(diff["course vs unsharded"]) <= 1e-15
    assert max(diff["course vs one process"]) <= 1e-13
    assert [sorted(p) for p in res["partition"]["course"]] == \
        [sorted(p) for p in res["partition"]["pytorch"]]
    per_rank = res["state_bytes"]
    unsharded = per_rank[0]["unsharded"]
    assert [b["course"] for b in per_rank] == [b["pytorch"] for b in per_rank]
    assert sum(b["course"] for b in per_rank) == unsharded          # every state value once
    assert max(b["course"] for b in per_rank) <= 0.6 * unsharded    # ~1/p with p = 2


def test_sharded_optimizer_state_is_about_a_third_on_three_ranks():
    res = pytorch_overlap(world_size=3, wrapper="zero1", optimizer="adamw", steps=2, batch=12)
    per_rank = [b["course"] for b in res["state_bytes"]]
    assert sum(per_rank) == res["state_bytes"][0]["unsharded"]
    assert max(per_rank) <= 0.45 * sum(per_rank)
    assert max(res["max_diff"]["course vs pytorch"]) <= 1e-15


@pytest.mark.parametrize("compute", [None, torch.bfloat16, torch.float16])
def test_fsdp_equals_fully_shard_under_the_same_mixed_precision_policy(compute):
    dtype = torch.float64 if compute is None else torch.float32
    res = pytorch_overlap(world_size=2, wrapper="fsdp", optimizer="adamw", steps=3, dtype=dtype,
                          compute_dtype=compute, reduce_dtype=None if compute is None else torch.float32)
    diff = res["max_diff"]
    assert len(diff["course vs pytorch"]) == 3
    assert max(diff["course vs pytorch"]) <= (1e-15 if compute is None else 1e-6)
    # against one process in float64: rounding only, or the compute dtype's rounding through AdamW
    assert max(diff["course vs one process"]) <= (1e-13 if compute is None else 0.05)
    assert max(diff["pytorch vs one process"]) <= (1e-13 if compute is None else 0.05)


def _tied_frozen_unused_on_rank():
    """The script's model (tied, frozen, unused on odd steps) under OverlappedDDP and DDP."""
    import copy

    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from mtb_helpers.dp import OverlappedDDP
    spec = importlib.util.spec_from_file_location("overlap_train", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    t, r = dist.get_world_size(), dist.get_rank()
    base = mod.Net().double()
    ours = OverlappedDDP(copy.deepcopy(base), bucket_cap_mb=0.0001, find_unused_parameters=True)
    theirs = DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=0.0001,
                                     find_unused_parameters=True)
    opts = [torch.optim.AdamW(m.parameters(), lr=0.05) for m in (ours, theirs)]
    n, diffs = mod.BATCH // t, []
    for step, (x, y) in enumerate(mod.data()):
        for net, opt in zip((ours, theirs), opts):
            opt.zero_grad()
            F.mse_loss(net(x[r * n:(r + 1) * n], step), y[r * n:(r + 1) * n]).backward()
            if net is ours:
                net.finish_gradient_synchronization()
            opt.step()
        diffs.append(max(float((a - b).abs().max()) for a, b in
                         zip(ours.module.parameters(), theirs.module.parameters())))
    none_after_odd = ours.module.extra.weight.grad is None and theirs.module.extra.weight.grad is None
    return diffs, none_after_odd


def test_tied_frozen_and_unused_parameters_as_distributed_data_parallel_handles_them():
    for diffs, none_after_odd in run(_tied_frozen_unused_on_rank, world_size=2, timeout=120):
        assert len(diffs) == 4 and max(diffs) <= 1e-15
        assert none_after_odd              # step 4 (odd) never used ``extra``: grad stays None
