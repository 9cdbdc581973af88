"""ColumnParallelLinear, RowParallelLinear and ParallelMLP against one process, at 1..4 ranks."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mtb_helpers import RankError, run
from mtb_helpers.tp.check import check_column_parallel, check_row_parallel, check_tp_mlp
from mtb_helpers.comm.records import record
from mtb_helpers.tp.layers import ColumnParallelLinear, ParallelMLP, RowParallelLinear, check_divisible

DTYPES = [torch.float32, torch.float64]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 2, 3, 4])
def test_column_layer_matches_one_process(t, dtype):
    for gather_output in (False, True):
        report = check_column_parallel(world_size=t, in_features=5, out_features=12, dtype=dtype,
                                       batch_shape=(3,), gather_output=gather_output)
        assert report.passed, str(report)
        # the same dot products as one process; only the BLAS kernel picked for the narrower
        # matrix may differ (MKL: 0 or 1 ulp), never more
        assert all(r.ulps <= 2 for r in report.rows if r.quantity == "output")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 2, 3, 4])
def test_row_layer_matches_one_process(t, dtype):
    for input_is_parallel in (True, False):
        report = check_row_parallel(world_size=t, in_features=12, out_features=7, dtype=dtype,
                                    batch_shape=(2, 2, 3), input_is_parallel=input_is_parallel)
        assert report.passed, str(report)
        # the partial products are summed in another order: a few ulps at most, not more
        assert all(r.ulps <= 4 for r in report.rows if r.quantity == "output")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 2, 3, 4])
def test_mlp_matches_one_process(t, dtype):
    report = check_tp_mlp(world_size=t, hidden=4, ffn_hidden=12, dtype=dtype, batch_shape=(2, 3))
    assert report.passed, str(report)
    worst = max(r.max_abs_err for r in report.rows)
    assert worst < (1e-5 if dtype == torch.float32 else 1e-13)


def test_non_power_of_two_world_size_and_shapes():
    assert check_tp_mlp(world_size=5, hidden=3, ffn_hidden=15, batch_shape=(7,)).passed
    assert check_column_parallel(world_size=3, in_features=1, out_features=9, batch_shape=(1, 1, 2)).passed


def test_shards_keep_nn_linear_layout_and_the_mlp_communicates_once_each_way():
    fc1, fc2 = nn.Linear(6, 12), nn.Linear(12, 6)

    def job():
        r = dist.get_rank()
        col = ColumnParallelLinear.from_full(fc1)
        row = RowParallelLinear.from_full(fc2)
        mlp = ParallelMLP.from_full(fc1, fc2)
        x = torch.randn(2, 5, 6, generator=torch.Generator().manual_seed(0), requires_grad=True)
        with record() as rec:
            mlp(x).sum().backward()
        return {"col_w": col.weight.detach(), "col_b": col.bias.detach(),
                "row_w": row.weight.detach(), "row_b": row.bias.detach(), "rank": r,
                "ops": [(e.op, e.direction, e.shape) for e in rec.communicating()]}

    out = run(job, world_size=3)
    for r, res in enumerate(out):
        assert torch.equal(res["col_w"], fc1.weight.detach()[4 * r:4 * r + 4])   # [out/t, in]
        assert torch.equal(res["col_b"], fc1.bias.detach()[4 * r:4 * r + 4])
        assert torch.equal(res["row_w"], fc2.weight.detach()[:, 4 * r:4 * r + 4])  # [out, in/t]
        assert torch.equal(res["row_b"], fc2.bias.detach())                       # full bias
        # the [2, 5, 12/t] activation never moves: one all-reduce of [2, 5, 6] each way
        assert res["ops"] == [("all_reduce", "forward", (2, 5, 6)), ("all_reduce", "backward", (2, 5, 6))]


def test_layers_run_in_a_subgroup():
    fc1, fc2 = nn.Linear(4, 8, dtype=torch.float64), nn.Linear(8, 4, dtype=torch.float64)
    x = torch.randn(3, 4, dtype=torch.float64)
    want = fc2(F.gelu(fc1(x))).detach()

    def job():
        groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        mlp = ParallelMLP.from_full(fc1, fc2, group=groups[dist.get_rank() // 2])
        return mlp(x).detach()

    for y in run(job, world_size=4):
        assert torch.allclose(y, want, rtol=0, atol=1e-14)


def test_one_rank_needs_no_process_group():
    lin = nn.Linear(3, 4)
    x = torch.randn(2, 3)
    assert torch.equal(ColumnParallelLinear.from_full(lin, gather_output=True)(x), lin(x))
    assert torch.equal(RowParallelLinear.from_full(lin, input_is_parallel=False)(x), lin(x))


def test_non_dividing_dimensions_are_refused_with_their_names():
    with pytest.raises(ValueError, match=r"out_features=10 is not divisible by the world size 3"):
        check_divisible("out_features", 10, 3)

    def job():
        ColumnParallelLinear.from_full(nn.Linear(4, 3))

    with pytest.raises(RankError, match=r"ColumnParallelLinear: out_features=3 .* world size 2") as info:
        run(job, world_size=2)
    assert info.value.exc_type == "ValueError"
    with pytest.raises(ValueError, match="fc1.out_features=8 must equal fc2.in_features=6"):
        ParallelMLP.from_full(nn.Linear(4, 8), nn.Linear(6, 4))
