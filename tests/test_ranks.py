"""The rank runtime: results, output relay, errors, timeouts, interrupts and clean-up."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
import torch.distributed as dist

import mtb_helpers
from mtb_helpers import RankError, RankTimeoutError, run, seed_all, shutdown
from mtb_helpers.runtime import ranks as ranks_module
from tests.procs import alive, wait_dead


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_every_rank_runs_in_one_group_and_results_come_back_by_rank(world_size):
    def job(scale, offset=0):
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        return dist.get_rank(), dist.get_world_size(), t.item() * scale + offset

    results = run(job, 2, offset=1, world_size=world_size)
    total = world_size * (world_size + 1) / 2
    assert results == [(r, world_size, total * 2 + 1) for r in range(world_size)]


def test_closures_lambdas_and_tensors_travel_both_ways():
    base = torch.arange(6.0).reshape(2, 3)

    def add_rank(x):
        return x + base * dist.get_rank()

    out = run(add_rank, torch.ones(2, 3), world_size=2)
    assert torch.equal(out[1], torch.ones(2, 3) + base)
    assert run(lambda: dist.get_rank() * 10, world_size=3) == [0, 10, 20]


def test_returned_tensors_keep_values_dtypes_and_shapes_whichever_way_they_travel():
    """Replies carry plain tensors as numpy arrays (fast); what numpy cannot hold keeps torch's
    pickling. Either way the owner gets equal tensors of the same dtype and shape."""
    def make():
        base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
        return {"t": base.T, "slice": base[1:3, ::2], "scalar": torch.tensor(3.5),
                "bool": base > 10, "int": base.long(), "half": base.half(),
                "bf16": base.bfloat16(), "grad": base.clone().requires_grad_(True),
                "param": torch.nn.Parameter(base.float()), "empty": torch.empty(0, 3)}

    [got] = run(make, world_size=1)
    for name, want in make().items():
        assert type(got[name]) is type(want), name
        assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
        assert torch.equal(got[name].detach(), want.detach()), name
    assert got["grad"].requires_grad and got["param"].requires_grad
    from mtb_helpers.runtime.worker import _dumps
    stream, _ = _dumps(("ok", 0, make()["t"]))
    assert b"_rebuild_tensor" not in stream   # the numpy route


def test_pool_is_reused_across_calls():
    first = run(os.getpid, world_size=2)
    second = run(os.getpid, world_size=2)
    assert first == second and len(set(first)) == 2 and os.getpid() not in first


def test_ranks_use_one_thread_and_loopback_only():
    def settings():
        return torch.get_num_threads(), os.environ.get("GLOO_SOCKET_IFNAME")

    assert run(settings, world_size=2) == [(1, "lo"), (1, "lo")]


def _policies():
    dist.all_reduce(torch.ones(1))   # gloo's threads exist and have worked
    group = dist.new_group([0, 1])   # threads of a group made later, too
    dist.all_reduce(torch.ones(1), group=group)
    dist.destroy_process_group(group)
    return sorted({os.sched_getscheduler(int(tid)) for tid in os.listdir("/proc/self/task")})


def test_every_thread_of_a_rank_runs_under_batch_scheduling_and_the_owner_does_not():
    """Ranks on one CPU switch far less when a wake-up does not preempt (worker.batch_scheduling);
    gloo's threads inherit it; the owner (a notebook's kernel) keeps the normal policy."""
    assert run(_policies, world_size=2) == [[os.SCHED_BATCH]] * 2
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


def _flight_recorder_entries() -> tuple[str | None, int]:
    import pickle

    import torch._C._distributed_c10d as c10d
    x = torch.ones(4)
    dist.all_reduce(x)                                   # a collective it would keep
    return os.environ.get("TORCH_FR_BUFFER_SIZE"), len(pickle.loads(c10d._dump_fr_trace())["entries"])


def test_ranks_keep_no_flight_recorder_of_their_collectives():
    """PyTorch's flight recorder stores every collective with its Python stack (~8 % of a
    capstone redraw on one CPU); the ranks turn it off (the course names a hang's ranks itself)."""
    assert run(_flight_recorder_entries, world_size=2) == [("0", 0)] * 2


def test_output_is_relayed_after_the_call_in_rank_order_with_fd_level_capture(capfd):
    def chatty():
        rank = dist.get_rank()
        time.sleep(0.05 * (3 - rank))  # rank 3 prints first in wall-clock order
        print(f"python print {rank}")
        os.write(1, f"raw fd write {rank}\n".encode())  # what C++ code would do
        os.write(2, f"to stderr {rank}\n".encode())
        return rank

    run(chatty, world_size=4)
    out, err = capfd.readouterr()
    lines = out.splitlines()
    expected = []
    for r in range(4):
        expected += [f"[rank {r}] python print {r}", f"[rank {r}] raw fd write {r}"]
    assert lines == expected
    assert err.splitlines() == [f"[rank {r}] to stderr {r}" for r in range(4)]

    run(lambda: None, world_size=4)  # nothing from the previous call may show up again
    out, err = capfd.readouterr()
    assert out == "" and err == ""


@pytest.mark.timeout(60)  # a RankError that waited for the 600 s timeout would fail here
def test_rank_error_names_rank_and_source_line_and_does_not_wait_for_the_timeout():
    def fails_on_rank_1():
        if dist.get_rank() == 1:
            raise ValueError("shard has the wrong shape")
        dist.barrier()  # rank 0 now waits forever for rank 1

    with pytest.raises(RankError) as info:
        run(fails_on_rank_1, world_size=2, timeout=600)
    assert info.value.rank == 1
    assert info.value.exc_type == "ValueError"
    message = str(info.value)
    assert "shard has the wrong shape" in message
    assert 'raise ValueError("shard has the wrong shape")' in message  # the caller's source line
    assert run(lambda: dist.get_rank(), world_size=2) == [0, 1]


def test_mismatched_collective_times_out_naming_the_waiting_rank_and_line():
    def rank_1_skips_the_all_reduce():
        if dist.get_rank() == 0:
            t = torch.ones(3)
            dist.all_reduce(t)  # nobody joins
        return dist.get_rank()

    with pytest.raises(RankTimeoutError) as info:
        run(rank_1_skips_the_all_reduce, world_size=2, timeout=2)
    err = info.value
    assert err.finished == [1]
    assert list(err.waiting) == [0]
    point = err.waiting[0]
    assert point.collective == "all_reduce"
    assert point.source == "dist.all_reduce(t)  # nobody joins"
    assert "finished: rank 1; still waiting: rank 0" in str(err)
    assert "rank 0 waits in all_reduce" in str(err)
    assert run(lambda: dist.get_rank(), world_size=2) == [0, 1]


def test_endless_loop_times_out_and_says_where():
    def spins():
        while dist.get_rank() == 1:
            pass
        return "done"

    with pytest.raises(RankTimeoutError) as info:
        run(spins, world_size=2, timeout=1)
    assert info.value.finished == [0]
    assert info.value.waiting[1].function == "spins"
    assert info.value.waiting[1].collective is None


def test_a_rank_that_dies_is_reported_and_replaced():
    def dies():
        if dist.get_rank() == 1:
            os._exit(7)
        return 0

    with pytest.raises(RankError) as info:
        run(dies, world_size=2, timeout=60)
    assert info.value.rank == 1 and "exit code 7" in str(info.value)
    assert run(lambda: 1, world_size=2) == [1, 1]


def test_interrupt_stops_every_rank_at_once():
    pids = run(os.getpid, world_size=2)
    main = threading.main_thread().ident
    timer = threading.Timer(0.5, lambda: signal.pthread_kill(main, signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        run(time.sleep, 60, world_size=2, timeout=120)
    timer.join()
    assert wait_dead(pids), "ranks survived the interrupt"
    assert run(lambda: 2, world_size=2) == [2, 2]


def test_shutdown_stops_ranks_and_removes_the_rendezvous_directory():
    pids = run(os.getpid, world_size=3)
    workdir = ranks_module._pools[3].workdir
    assert os.path.isdir(workdir)
    shutdown()
    assert wait_dead(pids)
    assert not os.path.exists(workdir)
    assert run(lambda: 3, world_size=3) == [3, 3, 3]  # and the package still works afterwards


@pytest.mark.parametrize("bad", [0, -1, mtb_helpers.MAX_WORLD_SIZE + 1, 2.0, True, "2", None])
def test_bad_world_size_is_refused_before_any_rank_starts(bad):
    before = dict(ranks_module._pools)
    with pytest.raises(ValueError, match="world_size"):
        run(lambda: 0, world_size=bad)
    assert ranks_module._pools == before


@pytest.mark.parametrize("bad", [0, -1.0, "5"])
def test_bad_timeout_is_refused(bad):
    with pytest.raises(ValueError, match="timeout"):
        run(lambda: 0, world_size=1, timeout=bad)


def test_seed_all_gives_every_rank_and_the_caller_the_same_numbers():
    def draw():
        seed_all(123)
        return torch.randn(4)

    drawn = run(draw, world_size=3)
    seed_all(123)
    reference = torch.randn(4)
    for tensor in drawn:
        assert torch.equal(tensor, reference)


def test_warm_up_starts_a_pool_that_run_then_uses():
    shutdown()
    mtb_helpers.warm_up(2, background=False)
    pool = ranks_module._pools[2]
    pids = list(pool.pids)
    assert all(alive(pid) for pid in pids)
    assert run(os.getpid, world_size=2) == pids


def test_pools_beyond_the_rank_budget_are_stopped():
    run(lambda: 0, world_size=4)
    four = run(os.getpid, world_size=4)
    run(lambda: 0, world_size=8)  # 4 + 8 > budget: the 4-rank pool goes
    assert 4 not in ranks_module._pools
    assert wait_dead(four)


def test_an_interrupt_while_the_call_is_being_sent_stops_every_rank(monkeypatch):
    pids = run(os.getpid, world_size=2)
    pool = ranks_module._pools[2]
    sent = []
    real_send = type(pool.conns[0]).send_bytes

    def send_then_interrupt(conn, data):
        real_send(conn, data)
        sent.append(conn)
        if len(sent) == 1:  # rank 0 has the call, rank 1 never will
            raise KeyboardInterrupt

    monkeypatch.setattr(type(pool.conns[0]), "send_bytes", send_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        run(dist.barrier, world_size=2)
    monkeypatch.undo()
    assert wait_dead(pids), "a rank was left waiting in the barrier"
    assert run(lambda: 5, world_size=2) == [5, 5]


def test_timeout_message_gives_the_advice_that_fits_the_waiting_op():
    """A collective's advice (a rank skipped it) for collectives; a send/recv's (both ranks send
    first) for point-to-point waits; both when both wait. Never the collective advice for send."""
    from mtb_helpers.runtime.errors import WaitPoint, timeout_message

    def at(op):
        return WaitPoint(op, "<notebook cell>", 3, "fn", "src")
    collective = "A collective waits until every rank of the group calls it"
    p2p = "A blocking send waits until its peer posts the matching recv"
    both_send = timeout_message(2.0, [], {0: at("send"), 1: at("send")})
    assert p2p in both_send and collective not in both_send
    skipped = timeout_message(2.0, [1], {0: at("all_reduce")})
    assert collective in skipped and p2p not in skipped
    mixed = timeout_message(2.0, [], {0: at("recv"), 1: at("all_gather")})
    assert collective in mixed and p2p in mixed
    unknown = timeout_message(2.0, [], {0: None})
    assert collective not in unknown and p2p not in unknown
