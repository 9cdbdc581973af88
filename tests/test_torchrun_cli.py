"""The minitrainbench checks run unchanged inside a torchrun job (gloo on CPU, 2 ranks)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest


def torchrun(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", "-m", "mtb_helpers.cli", *args],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("command", [["tp", "check"], ["tp", "sequence"], ["collectives"],
                                     ["dp", "check"], ["moe", "check"]])
def test_checks_pass_under_torchrun_and_only_rank_0_prints(command):
    out = torchrun(*command, "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)  # one JSON document: a second rank printing would break it
    assert report["passed"] is True
    assert '"world_size": 2' in out.stdout  # torchrun's size, not a pool's


def test_a_deliberate_bug_fails_the_job():
    out = torchrun("tp", "mlp", "--bug", "f-backward-identity")
    assert out.returncode != 0
    assert "FAIL" in out.stdout
