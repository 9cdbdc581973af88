"""Importing the package changes nothing in the student's kernel: no environment variable, no
thread count. Only the ranks get one thread each; the kernel's one-time preparation for sharing
its pages with the forkserver (gc.freeze, the allocator's settings) happens once, not at every
forkserver start."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_package_changes_no_environment_variable_or_thread_count():
    got = _python(
        "import json, os\n"
        "before = dict(os.environ)\n"
        "import mtb_helpers, mtb_helpers.check, mtb_helpers.cli\n"
        "import torch\n"
        "print(json.dumps({'changed': sorted(k for k in set(before) | set(os.environ)\n"
        "                                    if before.get(k) != os.environ.get(k)),\n"
        "                  'threads': torch.get_num_threads()}))")
    plain = _python("import json, torch; print(json.dumps({'threads': torch.get_num_threads()}))")
    assert got["changed"] == []
    assert got["threads"] == plain["threads"]


def test_ranks_get_one_thread_and_the_kernel_keeps_its_own_and_prepares_once():
    got = _python(
        "import gc, json, torch\n"
        "from mtb_helpers import run, shutdown\n"
        "from mtb_helpers.runtime import fork_helper\n"
        "kernel = torch.get_num_threads()\n"
        "ranks = run(torch.get_num_threads, world_size=2)\n"
        "first = fork_helper._owner_prepared\n"
        "shutdown()                              # the forkserver stops; the next run starts it again\n"
        "calls = []\n"
        "real = gc.freeze\n"
        "gc.freeze = lambda: calls.append(1) or real()\n"
        "again = run(torch.get_num_threads, world_size=2)\n"
        "print(json.dumps({'kernel': [kernel, torch.get_num_threads()], 'ranks': ranks + again,\n"
        "                  'prepared': first, 'freezes_after_restart': len(calls)}))")
    assert got["ranks"] == [1, 1, 1, 1]
    assert got["kernel"][0] == got["kernel"][1]
    assert got["prepared"] is True and got["freezes_after_restart"] == 0
