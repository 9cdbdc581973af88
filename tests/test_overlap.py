"""The hiding-communication wrappers (OverlappedDDP, ShardedOptimizer, FSDP) in ordinary training
scripts under any process group, their buckets, their refusals, and a rank that fails mid-backward.

The scripts (tests/scripts/overlap_train.py) train a model with tied weights, a frozen layer and a
layer unused on odd steps, and compare with one process on the whole batch (fp64).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mtb_helpers import RankError, run
from tests.procs import alive, wait_dead
from mtb_helpers.comm.records import record
from mtb_helpers.dp import FSDP, OverlappedDDP, ShardedOptimizer
from mtb_helpers.dp.overlap import assign_buckets
from mtb_helpers.dp.sharded_optimizer import partition_by_size

SCRIPT = Path(__file__).parent / "scripts" / "overlap_train.py"
MODES = "ddp,ddp-after,zero1,zero1-course-adam,fsdp,fsdp-bf16"


def _script(*launcher: str, args: tuple[str, ...]) -> tuple[subprocess.CompletedProcess, float, int]:
    """Run the script in its own session; the result, seconds taken, processes left in the session."""
    start = time.monotonic()
    proc = subprocess.Popen([*launcher, str(SCRIPT), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    finally:
        # multiprocessing's resource tracker leaves a moment after its parent: give it that moment
        stayed = [p.pid for p in psutil.process_iter(["pid"]) if _session(p) == proc.pid]
        wait_dead(stayed, within=15.0)
        left = [pid for pid in stayed if alive(pid)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), time.monotonic() - start, len(left)


def _session(p: psutil.Process) -> int | None:
    try:
        return os.getsid(p.pid)
    except (ProcessLookupError, PermissionError):
        return None


TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2")


@pytest.mark.parametrize("launcher", [(sys.executable,), TORCHRUN], ids=["spawn", "torchrun"])
def test_a_plain_script_trains_like_one_process(launcher):
    out, _, left = _script(*launcher, args=(MODES,))
    assert out.returncode == 0, out.stderr[-3000:]
    assert [line.split()[:2] for line in out.stdout.splitlines() if line[:2] in ("OK", "MI")] == \
        [["OK", m] for m in MODES.split(",")]
    assert left == 0


@pytest.mark.parametrize("launcher", [(sys.executable,), TORCHRUN], ids=["spawn", "torchrun"])
def test_a_rank_raising_mid_backward_stops_the_job_and_leaves_no_process(launcher):
    out, seconds, left = _script(*launcher, args=("raise",))
    assert out.returncode != 0
    assert "rank 1 fails in the middle of its backward" in out.stderr
    assert seconds < 200          # gloo's own timeout is 30 minutes: no rank was left hanging
    assert left == 0


def _train_in_rank(mode: str):
    import importlib.util

    import torch.distributed as dist
    spec = importlib.util.spec_from_file_location("overlap_train", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.train(dist.get_rank(), dist.get_world_size(), mode)


@pytest.mark.parametrize("world_size", [2, 3])
def test_the_wrappers_under_run_match_one_process(world_size):
    for mode in MODES.split(","):
        for err, tol in run(_train_in_rank, mode, world_size=world_size, timeout=120):
            assert err <= tol, (mode, err)


def test_under_run_a_rank_raising_mid_backward_is_named_and_the_next_call_works():
    with pytest.raises(RankError) as info:
        run(_train_in_rank, "raise", world_size=2, timeout=60)
    assert info.value.rank == 1 and "fails in the middle of its backward" in str(info.value)
    assert run(_train_in_rank, "ddp", world_size=2, timeout=60)[0][0] <= 1e-12


# --- buckets (no ranks) -------------------------------------------------------------------------

def _named(*numels, dtype=torch.float32):
    return [(f"p{i}", torch.zeros(n, dtype=dtype)) for i, n in enumerate(numels)]


def test_buckets_go_last_parameter_first_and_close_once_they_reach_the_cap():
    named = _named(100, 100, 100, 100)                        # 400 B each
    assert assign_buckets(named, 800) == [[3, 2], [1, 0]]
    assert assign_buckets(named, 801) == [[3, 2, 1], [0]]     # the open bucket comes last
    assert assign_buckets(named, 0) == [[3], [2], [1], [0]]   # cap 0: one all-reduce per parameter


def test_a_large_tensor_joins_the_open_bucket_and_closes_it_as_pytorch_does():
    import torch.distributed as dist
    named = _named(100, 100, 1000, 100, 100)
    ours = assign_buckets(named, 1000)
    theirs, _ = dist._compute_bucket_assignment_by_size([p for _, p in named], [1000],
                                                         [False] * 5, [4, 3, 2, 1, 0])
    assert ours == [list(b) for b in theirs] == [[4, 3, 2], [1, 0]]


def test_each_dtype_keeps_its_own_bucket():
    named = _named(100, 100) + [("h", torch.zeros(100, dtype=torch.float64))]
    assert assign_buckets(named, 800) == [[2], [1, 0]]        # 800 B of fp64 closes alone


def test_partitions_are_balanced_largest_first():
    owner = partition_by_size([10, 40, 30, 20], 2)
    assert owner == [0, 0, 1, 1]                              # 40 -> 0, 30 -> 1, 20 -> 1, 10 -> 0
    loads = [sum(n for n, o in zip([10, 40, 30, 20], owner) if o == r) for r in range(2)]
    assert loads == [50, 50]


# --- refusals, inside ranks (the wrappers are built there) ----------------------------------

def _refusals() -> dict[str, str]:
    def msg(fn):
        try:
            fn()
        except ValueError as e:
            return str(e)
        return "accepted"
    lin = lambda: nn.Linear(2, 2)
    wrapped = OverlappedDDP(lin())
    two_devices = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2, device="meta"))
    return {
        "negative cap": msg(lambda: OverlappedDDP(lin(), bucket_cap_mb=-1)),
        "nan cap": msg(lambda: OverlappedDDP(lin(), bucket_cap_mb=float("nan"))),
        "inf cap": msg(lambda: OverlappedDDP(lin(), bucket_cap_mb=float("inf"))),
        "bool cap": msg(lambda: OverlappedDDP(lin(), bucket_cap_mb=True)),
        "twice": msg(lambda: OverlappedDDP(wrapped.module)),
        "wrapper twice": msg(lambda: FSDP(wrapped)),
        "devices": msg(lambda: OverlappedDDP(two_devices)),
        "fsdp devices": msg(lambda: FSDP(two_devices)),
        "selects nothing": msg(lambda: FSDP(lin(), shard=lambda m: False)),
        "int dtype": msg(lambda: FSDP(lin(), compute_dtype=torch.int32)),
        "reduce dtype": msg(lambda: FSDP(lin(), reduce_dtype="float32")),
        "optimizer class": msg(lambda: ShardedOptimizer(lin().parameters(), "AdamW", lr=1e-3)),
        "not a module": msg(lambda: OverlappedDDP(torch.zeros(2))),
    }


def test_bad_input_is_refused_at_construction_naming_the_argument():
    got = run(_refusals, world_size=2)[0]
    for key in ("negative cap", "nan cap", "inf cap", "bool cap"):
        assert "bucket_cap_mb" in got[key], got[key]
    for key in ("twice", "wrapper twice"):
        assert "already wrapped" in got[key], got[key]
    assert "different devices" in got["devices"] and "different devices" in got["fsdp devices"]
    assert "selects no module" in got["selects nothing"]
    assert "compute_dtype" in got["int dtype"] and "reduce_dtype" in got["reduce dtype"]
    assert "optimizer_cls" in got["optimizer class"] and "module must be" in got["not a module"]


def test_without_a_process_group_the_wrapper_says_where_to_build_it():
    with pytest.raises(RuntimeError, match="no process group"):
        OverlappedDDP(nn.Linear(2, 2))


# --- no_sync, unused parameters, what stays allocated ---------------------------------------

def _accumulate(micro: list, ref_grads: list) -> dict:
    import torch.distributed as dist
    t, r = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    ddp = OverlappedDDP(model, bucket_cap_mb=0)
    counts = []
    for i, (x, y) in enumerate(micro):
        n = len(x) // t
        last = i == len(micro) - 1
        with record() as rec:
            if last:
                F.mse_loss(ddp(x[r * n:(r + 1) * n]), y[r * n:(r + 1) * n]).backward()
                ddp.finish_gradient_synchronization()
            else:
                with ddp.no_sync():
                    F.mse_loss(ddp(x[r * n:(r + 1) * n]), y[r * n:(r + 1) * n]).backward()
                    ddp.finish_gradient_synchronization()     # inside no_sync: does nothing
        counts.append(rec.count("all_reduce"))
    err = max((p.grad - g).abs().max().item() for p, g in zip(model.parameters(), ref_grads))
    comm = [e.name for e in ddp.timeline if e.kind == "comm"]
    compute = [e for e in ddp.timeline if e.kind == "compute"]
    return {"counts": counts, "err": err, "buckets": ddp.buckets, "comm": comm,
            "ordered": all(e.end >= e.start for e in ddp.timeline) and len(compute) == 4}


def test_no_sync_accumulates_locally_and_the_next_backward_reduces_the_sum():
    gen = torch.Generator().manual_seed(3)
    micro = [(torch.randn(4, 3, generator=gen, dtype=torch.float64),
              torch.randn(4, 2, generator=gen, dtype=torch.float64)) for _ in range(3)]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    for x, y in micro:
        F.mse_loss(model(x), y).backward()
    ref = [p.grad.clone() for p in model.parameters()]
    for res in run(_accumulate, micro, ref, world_size=2):
        assert res["counts"] == [0, 0, 4]                  # 4 buckets of one parameter, once
        assert res["err"] < 1e-14
        assert res["buckets"] == [["2.bias"], ["2.weight"], ["0.bias"], ["0.weight"]]
        # .timeline: the last synchronised backward, one all-reduce per bucket in reduce order
        assert res["comm"] == [f"all-reduce bucket {k}" for k in range(4)] and res["ordered"]


def _fsdp_memory() -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4))
    fsdp = FSDP(model)
    x = torch.randn(2, 4)
    with record() as rec:
        fsdp(x).sum().backward()
        fsdp.finish_gradient_synchronization()
    freed = all(g.full.untyped_storage().nbytes() == 0 for gs in fsdp.units for g in gs)
    held = sum(p.numel() for p in fsdp.parameters())
    names = [e.name for e in fsdp.timeline if e.kind == "comm"]
    return {"freed": freed, "held": held, "gathers": rec.count("all_gather"),
            "scatters": rec.count("reduce_scatter"), "names": names,
            "grads": [p.grad is not None for p in fsdp.parameters()]}


def test_fsdp_holds_one_shard_frees_what_it_gathers_and_prefetches_the_next_unit():
    got = run(_fsdp_memory, world_size=2)[0]
    assert got["freed"]
    assert got["held"] == (40 + 36) // 2                     # each unit's flat [n_pad / t]
    assert got["gathers"] == 4 and got["scatters"] == 2      # 2 units: gathered fwd + bwd
    assert got["names"].count("all-gather 2 (prefetch)") == 1      # during 0's forward
    assert got["names"].count("all-gather 0 (prefetch)") == 1      # during 2's backward
    assert all(got["grads"])


def _in_subgroups() -> dict:
    """4 ranks as two data-parallel groups {0, 1} and {2, 3}; each trains the same model on the
    same batches inside its own group (process_group=...), and reports its state_dict too."""
    import torch.distributed as dist
    r = dist.get_rank()
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    g, me = groups[r // 2], r % 2
    gen = torch.Generator().manual_seed(5)
    batches = [(torch.randn(4, 3, generator=gen, dtype=torch.float64),
                torch.randn(4, 2, generator=gen, dtype=torch.float64)) for _ in range(3)]
    out = {}
    for kind in ("ddp", "zero1", "fsdp"):
        torch.manual_seed(r)                      # different starts: the broadcast must fix them
        model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).double()
        net = (FSDP(model, process_group=g) if kind == "fsdp"
               else OverlappedDDP(model, bucket_cap_mb=0, process_group=g))
        opt = (ShardedOptimizer(net.parameters(), torch.optim.AdamW, process_group=g, lr=0.05)
               if kind == "zero1" else torch.optim.AdamW(net.parameters(), lr=0.05))
        for x, y in batches:
            opt.zero_grad()
            F.mse_loss(net(x[me * 2:(me + 1) * 2]), y[me * 2:(me + 1) * 2]).backward()
            net.finish_gradient_synchronization()
            opt.step()
        params = (net.gather_full_params() if kind == "fsdp"
                  else dict(net.module.named_parameters()))
        out[kind] = {k: v.detach().clone() for k, v in params.items()}
        if kind == "zero1":
            out["state"] = opt.state_dict()
    return out


def test_the_wrappers_work_inside_subgroups_and_zero1_state_dict_is_the_unsharded_one():
    res = run(_in_subgroups, world_size=4, timeout=120)
    gen = torch.Generator().manual_seed(5)
    batches = [(torch.randn(4, 3, generator=gen, dtype=torch.float64),
                torch.randn(4, 2, generator=gen, dtype=torch.float64)) for _ in range(3)]
    torch.manual_seed(0)                          # rank 0 of group {0, 1} started from this
    ref0 = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).double()
    torch.manual_seed(2)                          # rank 2 leads group {2, 3}
    ref2 = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).double()
    states = []
    for ref in (ref0, ref2):
        opt = torch.optim.AdamW(ref.parameters(), lr=0.05)
        for x, y in batches:
            opt.zero_grad()
            F.mse_loss(ref(x), y).backward()
            opt.step()
        states.append((dict(ref.named_parameters()), opt.state_dict()))
    for r, got in enumerate(res):
        want, want_state = states[r // 2]
        for kind in ("ddp", "zero1", "fsdp"):
            assert max((got[kind][k] - want[k]).abs().max().item() for k in want) < 1e-12, (r, kind)
        assert got["state"]["param_groups"][0]["params"] == want_state["param_groups"][0]["params"]
        for i, s in want_state["state"].items():
            for key in ("exp_avg", "exp_avg_sq"):
                assert (got["state"]["state"][i][key] - s[key]).abs().max() < 1e-12


def _resume() -> float:
    """ShardedOptimizer: 2 steps, state_dict, a fresh optimizer loads it, 2 more steps; against 4
    uninterrupted steps."""
    import torch.distributed as dist
    r = dist.get_rank()
    gen = torch.Generator().manual_seed(7)
    batches = [(torch.randn(4, 3, generator=gen, dtype=torch.float64),
                torch.randn(4, 2, generator=gen, dtype=torch.float64)) for _ in range(4)]

    def steps(ddp, opt, bs):
        for x, y in bs:
            opt.zero_grad()
            F.mse_loss(ddp(x[r * 2:(r + 1) * 2]), y[r * 2:(r + 1) * 2]).backward()
            ddp.finish_gradient_synchronization()
            opt.step()

    def fresh():
        torch.manual_seed(0)
        ddp = OverlappedDDP(nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).double())
        return ddp, ShardedOptimizer(ddp.parameters(), torch.optim.AdamW, lr=0.05)

    ddp, opt = fresh()
    steps(ddp, opt, batches)
    straight = [p.detach().clone() for p in ddp.parameters()]
    ddp, opt = fresh()
    steps(ddp, opt, batches[:2])
    saved, params = opt.state_dict(), [p.detach().clone() for p in ddp.parameters()]
    ddp2, opt2 = fresh()
    with torch.no_grad():
        for p, v in zip(ddp2.parameters(), params):
            p.copy_(v)
    opt2.load_state_dict(saved)
    steps(ddp2, opt2, batches[2:])
    mine = [p for p, owner in opt2.owner.items() if owner == r]   # state: this rank's partition's
    return (max((a - b).abs().max().item() for a, b in zip(ddp2.parameters(), straight)),
            set(opt2.state) == set(mine) and opt2.state is opt2.local.state)


def test_sharded_optimizer_resumes_from_its_state_dict():
    assert all(err < 1e-14 and partition for err, partition in run(_resume, world_size=2))


def _wrappers_freed_after_a_step() -> dict[str, bool]:
    """On a rank: train one step under each wrapper, drop it; is it gone after a collection?"""
    import gc
    import weakref

    gone = {}
    for name, wrap in (("ddp", lambda m: OverlappedDDP(m, bucket_cap_mb=0.0001)),
                       ("fsdp", lambda m: FSDP(m))):
        torch.manual_seed(0)
        model = wrap(nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2)).double())
        model(torch.randn(3, 4, dtype=torch.float64)).sum().backward()
        model.finish_gradient_synchronization()
        ref = weakref.ref(model)
        del model
        gc.collect()
        gone[name] = ref() is None
    return gone


def test_a_wrapper_dropped_after_training_is_freed():
    # their gradient hooks live on the parameters, out of the garbage collector's sight: holding
    # the wrapper strongly kept it, its module and its buckets alive for the rank's lifetime
    # (notebook 14's ranks grew by ~4 MiB on every measured step)
    assert run(_wrappers_freed_after_a_step, world_size=2) == [{"ddp": True, "fsdp": True}] * 2
