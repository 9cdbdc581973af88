"""``minitrainbench dp check``: the four strategies, --json, --bug, exit codes 0 / 1 / 2."""
from __future__ import annotations

import json

import pytest

from mtb_helpers.cli import main


def test_all_strategies_pass_and_print_tables_memory_and_bytes(capsys):
    assert main(["dp", "check"]) == 0
    out = capsys.readouterr().out
    for strategy in ("ddp", "zero1", "zero2", "zero3"):
        assert f"strategy={strategy}" in out
    assert out.count("PASSED") == 4 and out.rstrip().endswith("all passed")
    assert "ZeRO paper 2Ψ+2Ψ+12Ψ" in out and "formula all-reduce 2(p-1)/p·eΨ = 2208" in out
    assert "step: 1 all_gather" in out     # ZeRO-1/2's all-gather after the step is listed


def test_one_strategy_as_json(capsys):
    assert main(["dp", "check", "--strategy", "zero2", "--world-size", "4", "--dtype", "float64",
                 "--batch", "12", "--hidden", "5", "--ffn-hidden", "7", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (check,) = data["checks"]
    assert data["passed"] is True and check["config"]["strategy"] == "zero2"
    assert check["memory"]["padded_numel"] == 84 and check["memory"]["per_rank"][2]["grads"] == 8 * 21
    assert check["communication"]["formula"] == 2 * 3 * 8 * 84 // 4


@pytest.mark.parametrize("bug, failing", [("dp-sum-not-average", ["ddp", "zero1", "zero2", "zero3"]),
                                          ("zero-stale-params", ["zero1", "zero2"])])
def test_bug_exits_1(capsys, bug, failing):
    assert main(["dp", "check", "--bug", bug, "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] is False
    assert [c["config"]["strategy"] for c in data["checks"] if not c["passed"]] == failing


@pytest.mark.parametrize("argv, message", [
    (["dp", "check", "--batch", "9"], "batch=9 is not divisible by the world size 2"),
    (["dp", "check", "--strategy", "ddp", "--bug", "zero-stale-params"], "does not apply"),
    (["dp", "check", "--bug", "bias-before-allreduce"], "does not apply"),
    (["dp", "check", "--lr", "-0.1"], "lr must be"),
    (["dp", "check", "--steps", "0"], "steps must be a positive integer"),
])
def test_bad_arguments_exit_2(capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_unknown_strategy_is_an_argparse_error():
    with pytest.raises(SystemExit) as exc:
        main(["dp", "check", "--strategy", "zero4"])
    assert exc.value.code == 2
