"""The forkserver is a fork of the owner (Linux, main thread): ranks share the owner's torch, and
the fork keeps nothing of the owner that could hurt: no descriptor, no signal handler, no OpenMP
team (runtime/fork_helper.py)."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest
import torch
import torch.distributed as dist

from mtb_helpers import run, shutdown
from mtb_helpers.runtime import ranks as ranks_module
from tests.procs import forkserver_pid, wait_dead

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork is Linux-only")


def _shared_dirty_mib_of_an_owner(env: dict) -> int:
    """Start 2 ranks in a fresh interpreter; how much of its memory it shares with them."""
    code = textwrap.dedent("""
        from mtb_helpers import run
        run(lambda: 1, world_size=2)
        rollup = open("/proc/self/smaps_rollup").read().split("Shared_Dirty:")[1]
        print(int(rollup.split()[0]) // 1024)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, **env}, check=True)
    return int(out.stdout.split()[-1])


def test_the_owner_shares_its_torch_with_the_forkserver_and_ranks_and_the_switch_turns_it_off():
    shared = _shared_dirty_mib_of_an_owner({})
    alone = _shared_dirty_mib_of_an_owner({"MTB_FORK_FORKSERVER": "0"})
    assert shared > 100, f"only {shared} MiB of the owner shared with its ranks"
    assert alone < 20, f"{alone} MiB shared with a forkserver that is a new interpreter"


def test_the_forkserver_keeps_none_of_the_owners_descriptors():
    # a kernel's zmq ports held by its forkserver would stop a restarted kernel binding them
    shutdown()
    read_end, write_end = os.pipe()
    try:
        pids = run(os.getpid, world_size=2)
        inode = os.fstat(write_end).st_ino
        for pid in [forkserver_pid(), *pids]:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            assert f"pipe:[{inode}]" not in links, f"process {pid} holds the owner's pipe"
        os.close(write_end)
        write_end = None
        assert select.select([read_end], [], [], 5)[0] and os.read(read_end, 1) == b""
    finally:
        os.close(read_end)
        if write_end is not None:
            os.close(write_end)


def test_sigterm_to_a_forked_forkserver_does_not_run_the_owners_clean_up():
    # The second forkserver is forked while the 2-rank pool exists; had it kept the owner's
    # SIGTERM handler, it would kill that pool's ranks and delete its work dir and pymp dir.
    shutdown()
    pids = run(os.getpid, world_size=2)
    workdir = ranks_module._pools[2].workdir
    os.kill(forkserver_pid(), signal.SIGKILL)
    time.sleep(0.3)

    def slow_pid():
        time.sleep(0.5)  # long enough for the pool to see its forkserver gone (it is "orphaned")
        return os.getpid()

    assert run(slow_pid, world_size=2) == pids
    assert run(lambda: dist.get_rank(), world_size=3) == [0, 1, 2]  # a new forkserver
    second = forkserver_pid()
    os.kill(second, signal.SIGTERM)
    assert wait_dead([second])
    assert run(os.getpid, world_size=2) == pids and os.path.isdir(workdir)
    assert run(lambda: dist.get_world_size(), world_size=3) == [3, 3, 3]
    shutdown()


def test_ranks_forked_after_the_owner_ran_openmp_threads_compute_without_hanging():
    # A forked OpenMP team of more than one thread hangs in the child; ranks use one thread.
    shutdown()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        a = torch.randn(1024, 1024)
        for _ in range(3):
            a @ a  # the owner's OpenMP team now exists
        sums = run(lambda: float((torch.ones(512, 512) @ torch.ones(512, 512)).sum()),
                   world_size=2, timeout=60)
        assert sums == [512.0 ** 3] * 2
    finally:
        torch.set_num_threads(threads)
        shutdown()


def test_from_another_thread_the_forkserver_is_a_new_interpreter():
    shutdown()
    result = {}
    thread = threading.Thread(target=lambda: result.update(pids=run(os.getpid, world_size=1)))
    thread.start()
    thread.join(120)
    assert result.get("pids")
    command = " ".join(psutil.Process(forkserver_pid()).cmdline())
    assert "multiprocessing.forkserver" in command
    shutdown()
    assert wait_dead(result["pids"])


def test_a_rank_gives_back_the_memory_a_call_freed():
    # Freed blocks between blocks still in use stay in glibc's heap unless the rank trims it
    # after each call (runtime/allocator.py): ranks on Binder's budget must not only grow.
    def churn():
        import gc
        import sys

        import psutil

        def holes(n):
            big = []
            for _ in range(n):
                big.append(torch.ones(4000))     # 16 KB each
                kept.append(torch.ones(8))       # a small block after each: the big ones are holes

        kept = sys._mtb_test_kept = []  # outlives the call, so the holes stay holes
        holes(10)  # everything a first allocation initialises, before the measurement
        gc.collect()
        before = psutil.Process().memory_info().rss
        holes(2000)  # 32 MB freed again, between blocks still alive
        return before

    before, = run(churn, world_size=1)
    pid, = run(os.getpid, world_size=1)
    grown = psutil.Process(pid).memory_info().rss - before
    assert grown < 10 * 2**20, f"the rank kept {grown / 2**20:.0f} MiB after the call"
