"""``minitrainbench moe check``: table, routing and bytes, --json, exit codes 0 / 1 / 2."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mtb_helpers.cli import main
from mtb_helpers.moe.bugs import MOE_BUGS


def test_check_passes_and_prints_table_routing_and_bytes(capsys):
    argv = ["moe", "check", "--world-size", "2", "--top-k", "2", "--capacity-factor", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "moe [world_size=2" in out and "PASSED" in out
    for quantity in ("output", "input_grad", "gate.weight_grad", "experts.3.fc2.weight_grad"):
        assert quantity in out
    assert "capacity per expert per rank: 4" in out and "dropped:" in out
    assert "rank 1: counts 16, dispatch" in out
    assert "all-gather + reduce-scatter instead: 512 B" in out


def test_check_json_carries_rows_and_routing(capsys):
    assert main(["moe", "check", "--world-size", "4", "--dtype", "float64", "--experts", "8",
                 "--tokens", "12", "--capacity-factor", "none", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (check,) = data["checks"]
    assert data["passed"] is True and check["check"] == "moe"
    assert check["config"]["num_experts"] == 8 and check["config"]["capacity_factor"] is None
    assert check["moe"]["owner"] == [0, 0, 1, 1, 2, 2, 3, 3] and len(check["moe"]["experts"]) == 12


@pytest.mark.parametrize("bug", MOE_BUGS)
def test_each_bug_exits_1(capsys, bug):
    assert main(["moe", "check", "--bug", bug, "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] is False and data["checks"][0]["config"]["bug"] == bug


@pytest.mark.parametrize("argv, message", [
    (["moe", "check", "--world-size", "3"], "num_experts=4 is not divisible by the world size 3"),
    (["moe", "check", "--top-k", "5"], "top_k=5 is more than num_experts=4"),
    (["moe", "check", "--capacity-factor", "0"], "capacity_factor must be None or a number > 0"),
    (["moe", "check", "--tokens", "9"], "tokens=9 is not divisible"),
    (["moe", "check", "--bug", "bias-before-allreduce"], "does not apply"),
])
def test_bad_arguments_exit_2(capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_argparse_errors_exit_2():
    with pytest.raises(SystemExit) as exc:
        main(["moe", "check", "--capacity-factor", "lots"])
    assert exc.value.code == 2


def test_check_runs_under_torchrun_and_only_rank_0_prints():
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node=2", "-m", "mtb_helpers.cli", "moe", "check",
                          "--top-k", "2", "--capacity-factor", "1.0", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads(out.stdout)   # one JSON document: a second rank printing would break it
    assert data["passed"] is True and data["checks"][0]["config"]["world_size"] == 2
    assert sum(data["checks"][0]["moe"]["dropped_per_expert"]) > 0
