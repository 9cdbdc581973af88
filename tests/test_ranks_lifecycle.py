"""The rank runtime seen from whole processes: scripts, owner death, exit, torchrun."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

from tests.procs import alive, wait_dead

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "student.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_functions_from_a_scripts_main_run_and_errors_show_the_scripts_line(tmp_path):
    script = _script(tmp_path, """
        import torch, torch.distributed as dist
        from mtb_helpers import run, RankError

        def scaled_rank(k):
            return dist.get_rank() * k

        def broken():
            return {"rank": dist.get_rank()}["missing key"]

        if __name__ == "__main__":
            print("results", run(scaled_rank, 3, world_size=3))
            try:
                run(broken, world_size=2)
            except RankError as e:
                print("caught", e)
        """)
    out = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "results [0, 3, 6]" in out.stdout
    assert 'return {"rank": dist.get_rank()}["missing key"]' in out.stdout
    assert "KeyError" in out.stdout


def test_ranks_exit_by_themselves_when_their_owner_is_killed(tmp_path):
    script = _script(tmp_path, """
        import json, os, sys, time
        from multiprocessing import forkserver
        from mtb_helpers import run
        pids = run(os.getpid, world_size=3)
        server = forkserver._forkserver._forkserver_pid
        print(json.dumps(pids + [server]), flush=True)
        time.sleep(600)
        """)
    owner = subprocess.Popen([sys.executable, script], stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(owner.stdout.readline())
        assert all(alive(p) for p in pids)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert wait_dead(pids), "ranks or the forkserver outlived their owner"


def test_nothing_is_left_behind_when_the_interpreter_exits(tmp_path):
    script = _script(tmp_path, """
        import json, os
        from mtb_helpers import run
        print(json.dumps(run(os.getpid, world_size=2) + run(os.getpid, world_size=4)))
        """)
    out = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    pids = json.loads(out.stdout.splitlines()[-1])
    assert len(set(pids)) == 6
    assert wait_dead(pids)


def test_under_torchrun_run_uses_the_launched_group(tmp_path):
    script = _script(tmp_path, """
        import os, torch.distributed as dist
        from mtb_helpers import run
        from mtb_helpers.runtime.ranks import resolve_world_size
        size = resolve_world_size(5)  # torchrun's size wins over the default
        ranks = run(lambda: (dist.get_rank(), os.getpid()), world_size=size)
        if dist.get_rank() == 0:
            pids = {pid for _, pid in ranks}
            print("RESULT", size, [r for r, _ in ranks], len(pids), os.getpid() in pids)
        """)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node=2", script],
                         capture_output=True, text=True, timeout=180, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    # every rank ran fn in its own (launched) process, no pool was started
    assert "RESULT 2 [0, 1] 2 True" in out.stdout


def test_a_group_run_created_in_a_launched_job_is_destroyed_at_exit(tmp_path):
    # A gloo group alive at interpreter exit can abort the rank ("terminate called without an
    # active exception", about one torchrun job in four before this was fixed).
    script = _script(tmp_path, """
        import atexit, socket, os
        import torch.distributed as dist
        from mtb_helpers import run
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        print("results", run(lambda: dist.get_rank(), world_size=1))
        atexit._run_exitfuncs()
        print("initialized after exit handlers:", dist.is_initialized())
        """)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    out = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "results [0]" in out.stdout
    assert "initialized after exit handlers: False" in out.stdout
