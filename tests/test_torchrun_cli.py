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


PREDICT = ["cost", "predict", "--collective", "all-reduce", "--bytes", "1e8", "--world-size", "8",
           "--alpha", "5e-6", "--bandwidth", "50e9"]


@pytest.mark.parametrize("command", [
    PREDICT,
    ["cost", "calibrate", "--collective", "all-reduce", "--sizes", "1024,65536", "--k", "1"],
    ["plan", "--model", "tiny-gpt", "--gpus", "8", "--global-batch", "8"],
])
def test_cost_and_plan_print_one_document_from_rank_0(command):
    """Issue 38, item 3: each rank printed its own document."""
    out = torchrun(*command, "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)           # one JSON document: a second rank printing would break it
    assert doc.get("world_size", 2) in (2, 8) and "error" not in doc


@pytest.mark.parametrize("command, named", [
    (PREDICT[:-1] + ["1e-300"], "--bandwidth 1e-300"),                   # a handler's refusal
    (PREDICT[:-1] + ["nan"], "argument --bandwidth: nan"),               # argparse's refusal
    (["cost", "calibrate", "--collective", "all-reduce", "--sizes", "4,5,6,7"], "--sizes 4,5,6,7"),
])
def test_bad_input_under_torchrun_is_one_document_from_rank_0(command, named):
    out = torchrun(*command, "--json")
    assert out.returncode != 0
    doc = json.loads(out.stdout)
    assert doc["error"]["diagnosis"].startswith("bad arguments") and named in doc["error"]["message"]
    assert "minitrainbench" in out.stderr and "mtb_helpers/" not in out.stderr   # torchrun's
    # own traceback (its ChildFailedError) is all there is: none from the command
