"""The rank runtime under faults: no stale result ever, recovery from dead ranks and a dead
forkserver, the right rank blamed, interrupts and failed starts that leave nothing behind."""
from __future__ import annotations

import multiprocessing as mp
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
import torch.distributed as dist

from mtb_helpers import RankError, run, shutdown
from mtb_helpers.runtime import pool as pool_module
from mtb_helpers.runtime import ranks as ranks_module
from tests.procs import forkserver_pid, wait_dead


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_timeouts_are_refused_before_any_rank_starts(bad):
    before = dict(ranks_module._pools)
    with pytest.raises(ValueError, match="timeout"):
        run(lambda: 0, world_size=2, timeout=bad)
    assert ranks_module._pools == before


def test_a_huge_finite_timeout_works_and_the_next_call_gets_its_own_result():
    # above ~2.1e6 s the wait's millisecond count overflowed; the pool stayed "healthy" with the
    # reply in the pipe, and every later call returned it
    assert run(lambda: "first", world_size=2, timeout=1e9) == ["first", "first"]
    assert run(lambda: "second", world_size=2) == ["second", "second"]


def test_any_exception_while_waiting_breaks_the_pool_and_no_later_call_gets_its_reply(monkeypatch):
    run(lambda: 0, world_size=2)
    real_wait = pool_module.wait
    calls = []

    def wait_once_failing(objects, timeout=None):
        calls.append(1)
        if len(calls) == 1:
            raise OverflowError("the owner failed while the call was in flight")
        return real_wait(objects, timeout)

    monkeypatch.setattr(pool_module, "wait", wait_once_failing)
    with pytest.raises(OverflowError):
        run(lambda: "first", world_size=2)
    monkeypatch.undo()
    assert run(lambda: "second", world_size=2) == ["second", "second"]


def test_a_result_the_owner_cannot_unpickle_is_a_rank_error_and_leaves_no_stale_reply():
    def returns_a_class_only_the_rank_has():
        import sys
        import types
        module = types.ModuleType("only_on_this_rank")
        exec("class Secret:\n    pass\n", module.__dict__)
        sys.modules["only_on_this_rank"] = module
        return module.Secret()

    with pytest.raises(RankError) as info:
        run(returns_a_class_only_the_rank_has, world_size=2)
    assert "could not be unpickled" in str(info.value)
    assert "only_on_this_rank" in str(info.value)
    assert run(lambda: "second", world_size=2) == ["second", "second"]


def test_a_reply_tagged_with_another_calls_id_is_never_returned():
    run(lambda: 0, world_size=2)
    pool = ranks_module._pools[2]
    # a reply from an older call waits in rank 0's pipe (as after a failed owner)
    import cloudpickle
    stale = pickle.dumps(("call", pool.call_id, cloudpickle.dumps((lambda: "stale", (), {}))))
    pool.conns[0].send_bytes(stale)
    time.sleep(0.3)
    assert run(lambda: "fresh", world_size=2) == ["fresh", "fresh"]


def test_a_rank_killed_between_calls_is_replaced_and_the_next_call_works(capfd):
    pids = run(os.getpid, world_size=3)
    os.kill(pids[2], signal.SIGKILL)  # what Binder's out-of-memory killer does
    assert wait_dead([pids[2]])
    # its threads exit a few ms after the process is reported dead; only then its pipe closes
    # (a call sent inside that window fails alone: see the next test)
    assert ranks_module._pools[3].conns[2].poll(10)
    new = run(os.getpid, world_size=3)
    assert len(set(new)) == 3 and not set(new) & set(pids)
    err = capfd.readouterr().err
    assert "rank 2" in err and "SIGKILL" in err and "fresh pool" in err
    assert wait_dead(pids)
    assert run(lambda: 7, world_size=3) == [7, 7, 7]


def test_a_rank_that_dies_as_the_call_is_sent_fails_only_that_call(monkeypatch):
    pids = run(os.getpid, world_size=2)
    os.kill(pids[1], signal.SIGKILL)
    assert wait_dead([pids[1]])
    monkeypatch.setattr(pool_module.Pool, "dead_ranks", lambda self: {})  # the race: unseen
    with pytest.raises(RankError) as info:
        run(lambda: 1, world_size=2)
    monkeypatch.undo()
    assert info.value.rank == 1
    assert "rank 1 died" in str(info.value) and "SIGKILL" in str(info.value)
    assert run(lambda: 2, world_size=2) == [2, 2]


@pytest.mark.timeout(120)
def test_the_rank_that_died_is_blamed_and_the_others_errors_are_consequences():
    def rank_2_exits_inside_the_all_reduce():
        if dist.get_rank() == 2:
            os._exit(9)
        t = torch.ones(1000)
        dist.all_reduce(t)
        return t.sum().item()

    with pytest.raises(RankError) as info:
        run(rank_2_exits_inside_the_all_reduce, world_size=3, timeout=60)
    message = str(info.value)
    assert info.value.rank == 2
    assert message.startswith("rank 2 died (exit code 9)")
    assert "consequence" in message
    assert run(lambda: dist.get_rank(), world_size=3) == [0, 1, 2]


def test_a_second_interrupt_inside_the_kill_still_stops_every_rank(monkeypatch):
    pids = run(os.getpid, world_size=3)
    pool = ranks_module._pools[3]
    main = threading.main_thread().ident
    real_kill = os.kill
    interrupted = []

    def kill_and_interrupt_again(pid, sig):
        if not interrupted and pid in pids:
            interrupted.append(pid)
            signal.pthread_kill(main, signal.SIGINT)  # the student presses stop again
            time.sleep(0.05)  # the handler runs here, inside the kill
        real_kill(pid, sig)

    monkeypatch.setattr(pool_module.os, "kill", kill_and_interrupt_again)
    timer = threading.Timer(0.5, lambda: signal.pthread_kill(main, signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        run(time.sleep, 60, world_size=3, timeout=120)
    timer.join()
    monkeypatch.undo()
    assert interrupted and pool.broken
    assert wait_dead(pids), "ranks kept running the student's function"
    assert run(lambda: 3, world_size=3) == [3, 3, 3]


def test_an_interrupt_during_the_first_start_leaves_no_rank_and_no_work_dir(monkeypatch):
    shutdown()
    made = []
    real_mkdtemp = pool_module.tempfile.mkdtemp
    monkeypatch.setattr(pool_module.tempfile, "mkdtemp",
                        lambda **kw: made.append(real_mkdtemp(**kw)) or made[-1])
    started = []
    real_start = mp.process.BaseProcess.start

    def start_then_interrupt(proc):
        real_start(proc)
        started.append(proc)
        if len(started) == 2:
            raise KeyboardInterrupt  # Ctrl-C while the cold pool starts its ranks

    monkeypatch.setattr(mp.process.BaseProcess, "start", start_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        run(lambda: 0, world_size=3)
    monkeypatch.undo()
    assert made and not any(os.path.exists(d) for d in made)
    assert wait_dead([p.pid for p in started])
    assert 3 not in ranks_module._pools or not ranks_module._pools[3].procs
    assert run(lambda: 4, world_size=3) == [4, 4, 4]


def test_run_inside_a_rank_is_refused_clearly_and_leaves_no_work_dir(tmp_path):
    private = str(tmp_path)

    def nested():
        import tempfile
        from mtb_helpers import run as inner_run
        tempfile.tempdir = private
        try:
            inner_run(lambda: 0, world_size=1)
        except RuntimeError as exc:
            return str(exc), os.listdir(private)
        return "ran", os.listdir(private)

    (message, left), = run(nested, world_size=1)
    assert "inside a rank" in message
    assert left == []


def test_killing_the_forkserver_is_not_blamed_on_a_rank_and_the_pool_keeps_working():
    pids = run(os.getpid, world_size=2)
    server = forkserver_pid()
    os.kill(server, signal.SIGKILL)
    time.sleep(0.3)
    def slow_pid():
        time.sleep(0.5)  # the dead forkserver's sentinels fire while the ranks still work
        return os.getpid()

    assert run(slow_pid, world_size=2) == pids  # the ranks were alive: same pool, no error
    assert run(lambda: dist.get_rank(), world_size=3) == [0, 1, 2]  # a fresh forkserver
    shutdown()
    assert wait_dead(pids), "ranks orphaned by the forkserver outlived shutdown()"


def test_sigterm_to_the_owner_cleans_up_ranks_work_dir_and_pymp_dir(tmp_path):
    # what a graceful Jupyter shutdown or restart sends to the kernel
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent("""
        import json, os, time
        from multiprocessing import util
        from mtb_helpers import run
        from mtb_helpers.runtime import ranks
        pids = run(os.getpid, world_size=2)
        print(json.dumps([pids, ranks._pools[2].workdir, util.get_temp_dir()]), flush=True)
        time.sleep(600)
        """))
    env = dict(os.environ, TMPDIR=str(tmp_path))
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                             env=env)
    try:
        pids, workdir, pymp = json.loads(owner.stdout.readline())
        assert os.path.isdir(workdir) and os.path.isdir(pymp)
        owner.send_signal(signal.SIGTERM)
        assert owner.wait(timeout=30) == -signal.SIGTERM
    finally:
        owner.kill()
    assert wait_dead(pids)
    assert not os.path.exists(workdir), "the rank work dir was left in $TMPDIR"
    assert not os.path.exists(pymp), "multiprocessing's pymp-* dir was left in $TMPDIR"
