"""The regions: forward, backward, process groups, and the collective record they leave."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from mtb_helpers import run
from mtb_helpers import comm
from mtb_helpers.comm import records as collective_record


def _region_job(name: str, shape: tuple[int, ...], grad_shape: tuple[int, ...]):
    """On every rank: x = (rank+1) * arange, y = region(x), y.backward(g) with g = arange + 100*rank."""
    def job():
        r = dist.get_rank()
        x = (torch.arange(float(torch.Size(shape).numel())).reshape(shape) + 1) * (r + 1)
        x.requires_grad_(True)
        g = torch.arange(float(torch.Size(grad_shape).numel())).reshape(grad_shape) + 100 * r
        with comm.record() as rec:
            y = getattr(comm, name)(x)
            y.backward(g)
        return y.detach(), x.grad, rec
    return job


def _x(shape, r):
    return (torch.arange(float(torch.Size(shape).numel())).reshape(shape) + 1) * (r + 1)


def _g(shape, r):
    return torch.arange(float(torch.Size(shape).numel())).reshape(shape) + 100 * r


@pytest.mark.parametrize("t", [1, 2, 3])
def test_copy_is_identity_forward_and_all_reduce_backward(t):
    shape = (2, 3, 4)
    out = run(_region_job("copy_to_tensor_model_parallel_region", shape, shape), world_size=t)
    total_grad = sum(_g(shape, r) for r in range(t))
    for r, (y, dx, rec) in enumerate(out):
        assert torch.equal(y, _x(shape, r))
        assert torch.equal(dx, total_grad)
        (event,) = rec.events
        assert (event.op, event.operator, event.direction) == ("all_reduce", "f", "backward")
        assert event.shape == shape and event.bytes == 24 * 4
        assert event.sent_bytes == 2 * (t - 1) * 24 * 4 // t


@pytest.mark.parametrize("t", [1, 2, 3])
def test_reduce_is_all_reduce_forward_and_identity_backward(t):
    shape = (5, 2)
    out = run(_region_job("reduce_from_tensor_model_parallel_region", shape, shape), world_size=t)
    total = sum(_x(shape, r) for r in range(t))
    for r, (y, dx, rec) in enumerate(out):
        assert torch.equal(y, total)
        assert torch.equal(dx, _g(shape, r))
        assert [(e.op, e.operator, e.direction) for e in rec] == [("all_reduce", "g", "forward")]


@pytest.mark.parametrize("t", [1, 2, 3])
def test_gather_is_all_gather_last_dim_forward_and_split_backward(t):
    shape, full = (2, 3, 2), (2, 3, 2 * t)
    out = run(_region_job("gather_from_tensor_model_parallel_region", shape, full), world_size=t)
    gathered = torch.cat([_x(shape, r) for r in range(t)], dim=-1)
    for r, (y, dx, rec) in enumerate(out):
        assert torch.equal(y, gathered)
        assert torch.equal(dx, _g(full, r)[..., 2 * r:2 * r + 2])
        # dist.all_gather fills a list of t shards: [t, 2, 3, 2]; the split back is local, 0 B sent
        assert [(e.op, e.direction, e.out_shape) for e in rec] == [
            ("all_gather", "forward", (t, *shape)), ("split", "backward", shape)]
        assert rec.events[1].sent_bytes == 0 and rec.events[0].sent_bytes == (t - 1) * 12 * 4


@pytest.mark.parametrize("t", [1, 2, 3])
def test_scatter_is_split_last_dim_forward_and_all_gather_backward(t):
    full, shape = (4, 3 * t), (4, 3)
    out = run(_region_job("scatter_to_tensor_model_parallel_region", full, shape), world_size=t)
    for r, (y, dx, rec) in enumerate(out):
        assert torch.equal(y, _x(full, r)[:, 3 * r:3 * r + 3])
        assert torch.equal(dx, torch.cat([_g(shape, q) for q in range(t)], dim=-1))
        assert [(e.op, e.direction) for e in rec] == [("split", "forward"), ("all_gather", "backward")]


def test_regions_work_without_ranks_as_identities():
    """One process, no torch.distributed: every region is the identity and nothing is recorded
    (nothing reached torch.distributed)."""
    x = torch.randn(3, 4, 2, requires_grad=True)
    with comm.record() as rec:
        y = comm.reduce_from_tensor_model_parallel_region(comm.copy_to_tensor_model_parallel_region(x))
        y = comm.gather_from_sequence_parallel_region(comm.reduce_scatter_to_sequence_parallel_region(y))
        y.sum().backward()
    assert torch.equal(y, x) and torch.equal(x.grad, torch.ones(3, 4, 2))
    assert rec.count() == 0


def test_regions_stay_inside_their_process_group():
    def job():
        r = dist.get_rank()
        groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]   # every rank creates both
        mine = groups[r // 2]
        x = torch.full((2,), float(r + 1), requires_grad=True)
        with comm.record() as rec:
            y = comm.gather_from_tensor_model_parallel_region(
                comm.reduce_from_tensor_model_parallel_region(x, mine), mine)
            y.backward(torch.ones(4))
        return y.detach(), rec.events[0].group_size

    out = run(job, world_size=4)
    assert torch.equal(out[0][0], torch.full((4,), 3.0)) and torch.equal(out[3][0], torch.full((4,), 7.0))
    assert all(size == 2 for _, size in out)


def _nested_records():
    x = torch.ones(2, 8, requires_grad=True)
    with comm.record(keep_tensors=True) as outer:
        with comm.record() as inner:
            y = comm.copy_to_tensor_model_parallel_region(x)
        z = comm.reduce_from_tensor_model_parallel_region(y * 2)
        z.sum().backward()
    return inner, outer, list(collective_record._ACTIVE)


def test_record_counts_filters_serialises_and_nests():
    for inner, outer, active in run(_nested_records, world_size=2):
        assert inner.count() == 0            # f's all-reduce runs in backward, after inner closed
        assert outer.count("all_reduce") == 2 and outer.count(direction="forward") == 1
        assert outer.count(region="f") == 1 and outer.count(region="g") == 1
        assert outer.total_bytes("all_reduce", "forward") == 64
        assert torch.equal(outer.tensors[0][0], 2 * torch.ones(2, 8))   # g's input, this rank's
        assert torch.equal(outer.tensors[0][1], 4 * torch.ones(2, 8))   # its output, the sum
        again = comm.CollectiveRecord.from_list(outer.to_list())
        assert again.events == outer.events and again.tensors == []
        assert "forward: 1 all_reduce (64 B)" in outer.summary()
        assert outer.without_tensors().tensors == [] and active == []


def test_every_region_and_check_has_the_one_import_path_design_promises():
    from mtb_helpers.comm import regions as comm_sp
    from mtb_helpers.check import check_sequence_parallel
    from mtb_helpers.sp.check import check_sequence_parallel as in_its_module

    assert check_sequence_parallel is in_its_module
    for name in ("scatter_to_sequence_parallel_region", "gather_from_sequence_parallel_region",
                 "reduce_scatter_to_sequence_parallel_region"):
        assert getattr(comm, name) is getattr(comm_sp, name)
    with pytest.raises(AttributeError):
        comm.no_such_region  # noqa: B018


# what each region records in forward and in backward (None: nothing, the identity)
TRANSPOSE = {"copy_to_tensor_model_parallel_region": (None, "all_reduce"),
             "reduce_from_tensor_model_parallel_region": ("all_reduce", None),
             "gather_from_tensor_model_parallel_region": ("all_gather", "split"),
             "scatter_to_tensor_model_parallel_region": ("split", "all_gather"),
             "scatter_to_sequence_parallel_region": ("split", "all_gather"),
             "gather_from_sequence_parallel_region": ("all_gather", "reduce_scatter"),
             "reduce_scatter_to_sequence_parallel_region": ("reduce_scatter", "all_gather")}


def _every_region_on_rank() -> dict:
    out = {}
    for name in TRANSPOSE:
        x = torch.randn(4, 2, 6, dtype=torch.float64, requires_grad=True)
        with comm.record() as rec:
            y = getattr(comm, name)(x)
            y.backward(torch.ones_like(y))
        out[name] = [(e.region, e.op, e.direction) for e in rec]
    return out


def test_each_region_issues_its_collective_forward_and_the_transpose_backward():
    """Megatron's mappings.py: each backward is the transpose of its forward (an all-gather's
    transpose is a reduce-scatter, or a split; a split's, an all-gather), recorded under the
    region's name, local splits included (0 B sent)."""
    from mtb_helpers.comm.regions import REGIONS

    assert set(REGIONS) == set(TRANSPOSE)
    for events in run(_every_region_on_rank, world_size=2):
        for name, (fwd, bwd) in TRANSPOSE.items():
            want = [(name, op, d) for op, d in ((fwd, "forward"), (bwd, "backward")) if op]
            assert events[name] == want, name
