"""``minitrainbench tp check`` and ``tp mlp``: tables, --json, exit codes 0 / 1 / 2.

Runs through ``mtb_helpers.cli.main`` when every command module exists, else through the tp
module registered on a parser built the same way (other command modules may still be landing)."""
from __future__ import annotations

import json

import pytest

from mtb_helpers.cli import main


def test_tp_check_passes_and_prints_both_tables(capsys):
    assert main(["tp", "check", "--world-size", "3"]) == 0
    out = capsys.readouterr().out
    assert "column_parallel [world_size=3" in out and "row_parallel [world_size=3" in out
    assert out.count("PASSED") == 2
    for quantity in ("output", "input_grad", "weight_grad", "bias_grad"):
        assert quantity in out


@pytest.mark.parametrize("bug, failing", [("f-backward-identity", "column_parallel"),
                                          ("allgather-wrong-order", "column_parallel"),
                                          ("bias-before-allreduce", "row_parallel"),
                                          ("row-missing-allreduce", "row_parallel")])
def test_tp_check_bug_fails_the_layer_it_concerns(capsys, bug, failing):
    assert main(["tp", "check", "--bug", bug, "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] is False
    verdicts = {c["check"]: c["passed"] for c in data["checks"]}
    assert verdicts == {"column_parallel": failing != "column_parallel",
                        "row_parallel": failing != "row_parallel"}


def test_tp_mlp_json_and_float64(capsys):
    assert main(["tp", "mlp", "--dtype", "float64", "--json", "--batch-shape", "4"]) == 0
    data = json.loads(capsys.readouterr().out)
    (report,) = data["checks"]
    assert data["passed"] is True and report["config"]["dtype"] == "float64"
    assert report["config"]["batch_shape"] == [4] and len(report["rows"]) == 12
    assert main(["tp", "mlp", "--bug", "f-backward-identity"]) == 1
    assert "FAILED" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["tp", "check", "--world-size", "5"],                 # 12 features do not split in 5
    ["tp", "check", "--in-features", "7"],
    ["tp", "mlp", "--ffn-hidden", "9", "--world-size", "2"],
    ["tp", "check", "--bug", "no-such-bug"],
    ["tp", "mlp", "--bug", "allgather-wrong-order"],
    ["tp", "mlp", "--world-size", "0"],
])
def test_bad_arguments_exit_2_before_any_rank_starts(no_ranks, capsys, argv):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "error" in captured.out + captured.err


def test_argparse_errors_exit_2():
    with pytest.raises(SystemExit) as exc:
        main(["tp", "check", "--dtype", "float16"])
    assert exc.value.code == 2
