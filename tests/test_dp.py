"""The pieces of the data-parallel strategies: flat layout and padding, held bytes, the record's
summary, and each strategy on one rank (where it must be exactly one Adam step)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from mtb_helpers import run
from mtb_helpers.dp.bugs import BUGS as DP_REGISTRY
from mtb_helpers.dp.check import make_problem, reference_step, reference_steps
from mtb_helpers.comm.records import CollectiveEvent
from mtb_helpers.comm.records import CollectiveRecord, record
from mtb_helpers.dp.overlap import OverlappedDDP
from mtb_helpers.dp.strategies import FlatShards, flat, held_bytes, padded_numel
from mtb_helpers.dp.bugs import BUGS_BY_STRATEGY, DP_BUGS
from mtb_helpers.dp.fsdp import STRATEGY_CLASSES, build_strategy
from mtb_helpers.dp.strategies import Adam


def test_padded_numel_rounds_up_to_the_world_size():
    assert [padded_numel(n, 3) for n in (1, 3, 4, 552)] == [3, 3, 6, 552]
    assert padded_numel(7, 1) == 7


def test_layout_pieces_pad_with_zeros_and_cover_the_vector():
    layout = FlatShards((5, 3), world_size=2, pad=True)     # units padded to 6 and 4
    vec = torch.arange(1.0, 9.0)
    assert layout.padded_numel == 10 and layout.numel == 8
    full = layout.piece(vec, 0, sharded=False)
    assert full.tolist() == [1, 2, 3, 4, 5, 0, 6, 7, 8, 0]
    assert layout.piece(vec, 0, sharded=True).tolist() == [1, 2, 3, 6, 7]
    assert layout.piece(vec, 1, sharded=True).tolist() == [4, 5, 0, 8, 0]


def test_held_bytes_counts_a_shared_storage_once():
    buf = torch.zeros(10)
    assert held_bytes([buf[:5], buf[5:], buf]) == 40
    assert held_bytes([buf[:5].clone(), None]) == 20


def test_record_summary_lists_the_step_collectives():
    ev = lambda op, d: CollectiveEvent(op, "r", "", d, (4,), (8,), "float32", 16, 16, 2)  # noqa: E731
    rec = CollectiveRecord([ev("reduce_scatter", "backward"), ev("all_gather", "step")])
    assert rec.summary() == ("forward: nothing; backward: 1 reduce_scatter (16 B); "
                             "step: 1 all_gather (16 B)")


def _start_from_the_warm_up_step(model, warm, adam):
    """One reference Adam step on the warm-up batch, loaded into ``model``; returns its state."""
    start = reference_step(model, warm, adam)
    offset = 0
    for p in model.parameters():
        p.data = start["params"][offset:offset + p.numel()].view_as(p).clone()
        offset += p.numel()
    return start


def _one_rank_step(strategy, bug):
    model, warm, batch = make_problem(4, 3, 5, torch.float64, seed=2)
    adam = Adam()
    start = _start_from_the_warm_up_step(model, warm, adam)
    dp = build_strategy(strategy, model, start, adam, DP_REGISTRY.get(bug))   # a group of one rank
    dp.train_step(*batch)
    return dp.pieces(), reference_step(model, batch, adam, start)


def test_every_strategy_on_one_rank_is_the_single_process_step():
    for strategy in STRATEGY_CLASSES:
        for bug in (None, *BUGS_BY_STRATEGY[strategy]):   # with t = 1 no bug has anything to break
            got, ref = run(_one_rank_step, strategy, bug, world_size=1)[0]   # FSDP needs a group
            for q in ("params", "grads", "exp_avg", "exp_avg_sq"):
                assert torch.allclose(got[q][:len(ref[q])], ref[q], rtol=0, atol=1e-14), (strategy, q)


def _held_on_rank(strategy):
    model, warm, batch = make_problem(4, 3, 5, torch.float32, seed=0)
    start = reference_step(model, warm, Adam())
    dp = build_strategy(strategy, model, start)
    n = 4 // torch.distributed.get_world_size()
    r = torch.distributed.get_rank()
    dp.train_step(batch[0][r * n:(r + 1) * n], batch[1][r * n:(r + 1) * n])
    return dp.held()


def test_zero3_frees_the_gathered_parameters_and_zero2_the_full_gradient():
    psi = 3 * 5 + 5 + 5 * 3 + 3    # 38 parameters; ZeRO-3 units 20 and 18, padded to 20 and 18
    held3 = run(_held_on_rank, "zero3", world_size=2)
    assert held3[0]["params"] == held3[0]["grads"] == 4 * 19 and held3[0]["optimizer_state"] == 8 * 19
    held2 = run(_held_on_rank, "zero2", world_size=2)
    assert held2[1] == {"params": 4 * psi, "grads": 4 * psi // 2, "optimizer_state": 8 * psi // 2}
    held1 = run(_held_on_rank, "zero1", world_size=2)
    assert held1[1]["grads"] == 4 * psi


def _three_steps_on_one_rank(strategy, bug=None):
    model, warm, batches = make_problem(4, 3, 5, torch.float64, seed=4, steps=3)
    adam = Adam()
    start = _start_from_the_warm_up_step(model, warm, adam)
    dp = build_strategy(strategy, model, start, adam, DP_REGISTRY.get(bug))
    got = []
    for x, y in batches:
        dp.train_step(x, y)
        got.append(dp.pieces())
    return got, reference_steps(model, batches, adam, start)


def test_train_step_clears_gradients_so_every_step_is_the_single_process_step():
    # before zero_grad() existed, step 2 of DDP, ZeRO-1 and ZeRO-3 used g1 + g2
    for strategy in STRATEGY_CLASSES:
        got, ref = run(_three_steps_on_one_rank, strategy, world_size=1)[0]
        for k in range(3):
            for q in ("params", "grads", "exp_avg", "exp_avg_sq"):
                assert torch.allclose(got[k][q][:len(ref[k][q])], ref[k][q], rtol=0, atol=1e-14), \
                    (strategy, k, q)


def test_without_zero_grad_the_second_step_uses_the_sum_of_two_gradients():
    for strategy in ("ddp", "zero1", "zero3"):
        got, ref = run(_three_steps_on_one_rank, strategy, "dp-grads-not-cleared", world_size=1)[0]
        n = len(ref[0]["grads"])
        assert torch.allclose(got[0]["grads"][:n], ref[0]["grads"], rtol=0, atol=1e-14)
        assert not torch.allclose(got[1]["grads"][:n], ref[1]["grads"], rtol=0, atol=1e-6)


def test_each_wrong_strategy_is_a_subclass_of_the_one_it_replaces():
    for name in DP_BUGS:
        bug = DP_REGISTRY[name]
        assert bug.checks == ("data_parallel",)
        for correct, wrong in bug.replaces.items():
            assert issubclass(wrong, correct) and wrong is not correct, name
    assert BUGS_BY_STRATEGY["zero2"] == ("dp-double-average", "dp-sum-not-average",
                                         "zero-stale-params")


def _ours_and_torch_ddp(steps):
    import copy

    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    model, warm, batches = make_problem(8, 3, 5, torch.float64, seed=5, steps=steps)
    adam = Adam()
    start = {"params": flat(model.parameters()), "step": 0,
             **{k: torch.zeros(sum(p.numel() for p in model.parameters()), dtype=torch.float64)
                for k in ("exp_avg", "exp_avg_sq")}}
    ours = build_strategy("ddp", model, start, adam)
    theirs = DistributedDataParallel(copy.deepcopy(model))
    opt = adam.torch_optimizer(theirs.parameters())   # PyTorch's side: torch.optim, not the course's Adam
    t, r = dist.get_world_size(), dist.get_rank()
    for x, y in batches:
        n = x.shape[0] // t
        xs, ys = x[r * n:(r + 1) * n], y[r * n:(r + 1) * n]
        ours.train_step(xs, ys)
        opt.zero_grad(set_to_none=True)
        F.mse_loss(theirs(xs), ys).backward()
        opt.step()
    return flat(ours.model.parameters()), flat(theirs.module.parameters())


def test_ddp_strategy_equals_pytorch_ddp_over_several_steps_on_the_same_ranks():
    # torch's DistributedDataParallel also averages the gradient over ranks and its optimizer
    # clears grads each step: three steps of both must agree to float64 rounding
    for ours, theirs in run(_ours_and_torch_ddp, 3, world_size=2):
        assert torch.allclose(ours, theirs, rtol=0, atol=1e-13)


def _world_size_attributes() -> list[tuple[int, bool]]:
    model, warm, _ = make_problem(4, 3, 5, torch.float32, seed=0)
    start = reference_step(model, warm, Adam())
    built = [build_strategy(s, model, start) for s in STRATEGY_CLASSES]
    return [(dp.p, hasattr(dp, "t")) for dp in built]


def test_the_data_parallel_world_size_is_called_p_as_in_the_course_s_notation():
    """``p`` ranks of data parallelism (the glossary's letter; ``t`` is the tensor-parallel size):
    every strategy keeps it as ``self.p``, and no dp module says ``self.t``."""
    import inspect
    import re
    from pathlib import Path

    from mtb_helpers.dp.strategies import FlatStep
    assert run(_world_size_attributes, world_size=2) == [[(2, False)] * len(STRATEGY_CLASSES)] * 2
    assert "self.p" in inspect.getsource(FlatStep)
    dp = Path(__file__).resolve().parents[1] / "mtb_helpers" / "dp"
    assert [f.name for f in sorted(dp.glob("*.py")) if re.search(r"\bself\.t\b", f.read_text())] == []


def test_no_dp_module_routes_a_collective_through_comm_issue():
    """Issue 34: every dp collective is a plain torch.distributed call the lesson prints, named in
    the record with records.note; nothing in dp/ goes through comm.issue."""
    from pathlib import Path
    dp = Path(__file__).resolve().parents[1] / "mtb_helpers" / "dp"
    assert [f.name for f in sorted(dp.glob("*.py")) if "comm.issue" in f.read_text()] == []


def _zero3_wrapper() -> tuple:
    from mtb_helpers.dp import FSDP
    model, warm, _ = make_problem(4, 3, 5, torch.float32, seed=0)
    dp = build_strategy("zero3", model, reference_step(model, warm, Adam()))
    return type(dp.fsdp) is FSDP, dp.fsdp.prefetch, dp.fsdp.unit_names, len(dp.shards)


def test_zero3_is_notebook_14s_fsdp_with_prefetch_off_one_unit_per_linear_layer():
    """One class per idea: notebook 06's "zero3" runs the FSDP wrapper itself (its bugs are mixins
    in front of it), not a second ZeRO-3."""
    from mtb_helpers.dp import FSDP, OverlappedDDP
    from mtb_helpers.dp import ShardedOptimizer
    from mtb_helpers.dp.bugs import DoubleAverage, StaleParams
    assert STRATEGY_CLASSES["zero3"] is FSDP
    assert run(_zero3_wrapper, world_size=2) == [(True, False, ["0", "2"], 2)] * 2
    wrong = DP_REGISTRY["dp-double-average"].replaces[FSDP]
    assert issubclass(wrong, DoubleAverage) and issubclass(wrong, FSDP)
    # notebook 14's bucket divided by p twice is the same class as notebook 06's DDP's, and its
    # ZeRO-1 that never gathers the updated partitions is the same mixin as 06's stale ZeRO-1/2
    assert (DP_REGISTRY["ddp-double-average"].replaces[OverlappedDDP]
            is DP_REGISTRY["dp-double-average"].replaces[OverlappedDDP])
    assert issubclass(DP_REGISTRY["ddp-double-average"].replaces[OverlappedDDP], DoubleAverage)
    assert issubclass(DP_REGISTRY["zero1-no-broadcast"].replaces[ShardedOptimizer], StaleParams)
    assert "_share_partitions" in vars(StaleParams)   # ZeRO1's and ShardedOptimizer's all-gather


def _without_overlap() -> dict:
    torch.manual_seed(dist.get_rank())        # other parameters on each rank: init_sync=False keeps them
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)).double()
    before = [p.detach().clone() for p in model.parameters()]
    ddp = OverlappedDDP(model, bucket_cap_mb=0, overlap=False, init_sync=False)
    with record() as rec:
        ddp(torch.ones(2, 3, dtype=torch.float64)).sum().backward()
        during = len(rec.events)              # nothing reduced while the backward runs
        own = [p.grad.clone() for p in model.parameters()]
        ddp.finish_gradient_synchronization()
    return {"kept": all(torch.equal(a, p) for a, p in zip(before, model.parameters())),
            "buckets": ddp.buckets, "during": during, "own": own,
            "events": [(e.op, e.region, e.shape) for e in rec.events],
            "grads": [p.grad for p in model.parameters()]}


def test_overlapped_ddp_without_overlap_reduces_one_bucket_in_parameter_order_after_the_backward():
    """Notebook 06's DDP is OverlappedDDP(overlap=False): one bucket, in registration order (not
    assign_buckets' reverse order: gloo's sum depends on an element's place in the buffer), one
    all-reduce once the backward is done, averaged; init_sync=False broadcasts nothing."""
    out = run(_without_overlap, world_size=2)
    assert [o["kept"] for o in out] == [True, True]
    assert out[0]["buckets"] == [["0.weight", "0.bias", "1.weight", "1.bias"]]
    assert [o["during"] for o in out] == [0, 0]
    assert out[0]["events"] == [("all_reduce", "ddp_grad_bucket", (26,))]
    for o in out:
        for got, a, b in zip(o["grads"], out[0]["own"], out[1]["own"]):
            assert torch.allclose(got, (a + b) / 2, rtol=0, atol=1e-15)


def test_zero1_is_shardedoptimizer_stepping_the_written_out_adam_without_torch_dynamo():
    """Notebook 06's ZeRO-1/2 step notebook 14's ShardedOptimizer (one ZeRO-1) with dp/adam.py's
    Adam: their ranks never import torch._dynamo (~1 s, ~35 MB a rank). The mistake it must catch:
    torch.optim.Optimizer's own add_param_group, whose torch._disable_dynamo wrapper imports it."""
    import json
    import subprocess
    import sys
    import textwrap
    code = textwrap.dedent("""
        import json, sys, torch
        from mtb_helpers import run
        from mtb_helpers.dp import ShardedOptimizer
        from mtb_helpers.dp.check import make_problem
        from mtb_helpers.dp.fsdp import build_strategy
        from mtb_helpers.dp.strategies import ZeRO2, flat

        def job(torch_groups):
            model, _, (x, y) = make_problem(4, 3, 5, torch.float64, seed=2)
            params = flat(model.parameters())   # (check's reference_step would step torch.optim)
            start = {"params": params, "step": 0, "exp_avg": torch.zeros_like(params),
                     "exp_avg_sq": torch.zeros_like(params)}
            if torch_groups:
                wrong = type("TorchGroups", (ShardedOptimizer,),
                             {"add_param_group": torch.optim.Optimizer.add_param_group})
                dp = ZeRO2(wrong, model, start)
            else:
                dp = build_strategy("zero2", model, start)
            r, n = torch.distributed.get_rank(), 2
            dp.train_step(x[r * n:(r + 1) * n], y[r * n:(r + 1) * n])
            return isinstance(dp.optimizer, ShardedOptimizer), "torch._dynamo" in sys.modules

        print(json.dumps([run(job, False, world_size=2), run(job, True, world_size=2)]))
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    ours, wrong = json.loads(out.stdout.strip().splitlines()[-1])
    assert ours == [[True, False]] * 2, ours
    assert [w[1] for w in wrong] == [True, True], wrong
