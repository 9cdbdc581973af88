"""``minitrainbench cp check``: table, work, bytes, --json, exit codes 0 / 1 / 2."""
from __future__ import annotations

import json

import pytest

from mtb_helpers.cli import main
from mtb_helpers.cp.bugs import BUGS as CP_BUGS


def test_check_prints_table_work_and_bytes(capsys):
    assert main(["cp", "check", "--world-size", "4", "--causal", "--dtype", "float64"]) == 0
    out = capsys.readouterr().out
    assert "context_parallel [world_size=4" in out and "PASSED" in out
    assert "variant=ring" in out and "layout=contiguous" in out and "causal=True" in out
    for quantity in ("output", "q_grad", "k_grad", "v_grad"):
        assert quantity in out
    assert "formula [16, 32, 48, 64], imbalance max/mean 1.60" in out
    assert "bytes match the formulas: yes; work matches: yes" in out


def test_zigzag_allgather_json(capsys):
    assert main(["cp", "check", "--world-size", "2", "--variant", "allgather", "--layout",
                 "zigzag", "--causal", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (check,) = data["checks"]
    assert data["passed"] is True and check["config"]["layout"] == "zigzag"
    assert check["cp"]["work"]["forward"] == [80, 80]          # s=16: 5 pairs of 4 x 4 each
    assert check["cp"]["positions"][0] == [0, 1, 2, 3, 12, 13, 14, 15]


@pytest.mark.parametrize("bug", sorted(CP_BUGS))
def test_each_bug_exits_1(capsys, bug):
    variant = CP_BUGS[bug].checks[0][len("cp-"):]
    assert main(["cp", "check", "--variant", variant, "--layout", "zigzag", "--causal",
                 "--bug", bug, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["passed"] is False


@pytest.mark.parametrize("argv", [["--seq", "10", "--layout", "zigzag"], ["--world-size", "9"],
                                  ["--variant", "allgather", "--bug", "cp-no-rescale"]])
def test_bad_arguments_exit_2(capsys, argv):
    assert main(["cp", "check", *argv]) == 2
    assert "minitrainbench: error:" in capsys.readouterr().err


@pytest.mark.parametrize("argv, condition", [
    (["--world-size", "4", "--bug", "cp-local-causal-mask"], "a causal mask"),
    (["--world-size", "4", "--causal", "--variant", "allgather", "--bug", "cp-zigzag-wrong-order"],
     "the zigzag layout"),
    (["--world-size", "1", "--causal", "--bug", "cp-grads-not-sent-home"], "2 or more ranks")])
def test_a_bug_that_cannot_show_exits_2_before_any_rank_starts(no_ranks, capsys, argv, condition):
    assert main(["cp", "check", *argv]) == 2
    err = capsys.readouterr().err
    assert "minitrainbench: error:" in err and "cannot show here" in err and condition in err


def test_cp_check_runs_under_torchrun_and_only_rank_0_prints():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node=2", "-m", "mtb_helpers.cli", "cp", "check",
                          "--causal", "--layout", "zigzag", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)       # one JSON document: a second rank printing breaks it
    (check,) = report["checks"]
    assert report["passed"] is True and check["config"]["world_size"] == 2
    assert check["cp"]["work"]["forward"] == [80, 80]
