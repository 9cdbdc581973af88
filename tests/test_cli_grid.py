"""``minitrainbench grid check``: table, --json, exit codes 0 / 1 / 2, and under torchrun."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mtb_helpers.cli import main


def test_grid_check_passes_and_prints_the_table_and_groups(capsys):
    assert main(["grid", "check", "--tp", "2", "--dp", "2"]) == 0
    out = capsys.readouterr().out
    assert "tp_x_dp [world_size=4, tp=2, dp=2" in out and "PASSED" in out
    assert "fc2.bias_updated" in out and "dp_index * tp + tp_index" in out
    assert "rank 3: tp group [2, 3]: 2 all-reduce(s), 256 B sent; dp group [1, 3]: 4 all-reduce(s)" in out


@pytest.mark.parametrize("argv", [["--tp", "4", "--dp", "1"], ["--tp", "1", "--dp", "4"],
                                  ["--dtype", "float64", "--batch", "4", "--hidden", "6"]])
def test_other_grids_pass_as_json(capsys, argv):
    assert main(["grid", "check", *argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (report,) = data["checks"]
    assert data["passed"] is True and report["check"] == "tp_x_dp"
    assert len(report["rows"]) == 9 * 4


def test_a_bug_exits_1(capsys):
    assert main(["grid", "check", "--bug", "grid-dp-allreduce-in-tp-group", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    failed = {r["quantity"] for r in data["checks"][0]["rows"] if not r["passed"]}
    assert "output" not in failed and "fc1.weight_grad" in failed


@pytest.mark.parametrize("argv", [
    ["--tp", "3", "--dp", "2"],                      # 6 cells for 4 ranks
    ["--tp", "2", "--dp", "2", "--world-size", "2"],
    ["--tp", "4", "--dp", "1", "--ffn-hidden", "6"],
    ["--batch", "7"],
    ["--bug", "bias-before-allreduce"],
])
def test_bad_arguments_exit_2_before_any_rank_starts(no_ranks, capsys, argv):
    assert main(["grid", "check", *argv]) == 2
    assert "error" in capsys.readouterr().err


def test_grid_check_under_torchrun_uses_the_jobs_world_size():
    # 2 launched ranks: tp=2 x dp=1 fits, tp=2 x dp=2 does not (refused with exit 2 on every rank)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "mtb_helpers.cli", "grid", "check"]
    ok = subprocess.run([*cmd, "--tp", "1", "--dp", "2", "--json"], capture_output=True,
                        text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr[-3000:]
    data = json.loads(ok.stdout)   # one JSON document: only rank 0 printed
    assert data["passed"] is True and data["checks"][0]["config"]["world_size"] == 2
    bad = subprocess.run([*cmd, "--tp", "2", "--dp", "2"], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode != 0 and "does not match the world size 2" in bad.stderr
