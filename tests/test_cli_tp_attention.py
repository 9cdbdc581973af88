"""``minitrainbench tp attention`` and ``tp vocab``: tables, --json, exit codes 0 / 1 / 2."""
from __future__ import annotations

import json

import pytest

from mtb_helpers.cli import main


def test_attention_passes_at_three_ranks_and_prints_the_table(capsys):
    assert main(["tp", "attention", "--world-size", "3", "--heads", "6", "--head-dim", "3"]) == 0
    out = capsys.readouterr().out
    assert "tp_attention [world_size=3" in out and "PASSED" in out
    assert "qkv.weight_grad" in out and "forward: 1 all_reduce" in out


def test_attention_json_float64_and_a_bug(capsys):
    assert main(["tp", "attention", "--dtype", "float64", "--no-causal", "--json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)["checks"]
    assert report["config"]["causal"] is False and report["config"]["dtype"] == "float64"
    assert max(r["max_abs_err"] for r in report["rows"]) < 1e-12
    assert main(["tp", "attention", "--bug", "attn-wo-bias-every-rank", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    failed = {r["quantity"] for r in data["checks"][0]["rows"] if not r["passed"]}
    assert data["passed"] is False and failed == {"output"}


def test_vocab_passes_and_each_bug_fails(capsys):
    assert main(["tp", "vocab", "--world-size", "4", "--reduction", "sum"]) == 0
    out = capsys.readouterr().out
    assert "vocab_parallel [world_size=4" in out and "ce.target_logit" in out and "PASSED" in out
    assert main(["tp", "vocab", "--bug", "vocab-ce-sum-exp-not-allreduced", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    failed = {r["quantity"] for r in data["checks"][0]["rows"] if not r["passed"]}
    assert failed == {"ce.sum_exp", "loss", "logits_grad"}


@pytest.mark.parametrize("argv", [
    ["tp", "attention", "--world-size", "3"],                 # 4 heads do not split in 3
    ["tp", "attention", "--heads", "0"],
    ["tp", "attention", "--bug", "vocab-embedding-no-mask"],
    ["tp", "vocab", "--vocab", "10", "--world-size", "4"],
    ["tp", "vocab", "--bug", "no-such-bug"],
    ["tp", "vocab", "--tokens", "3", "0"],
])
def test_bad_arguments_exit_2_before_any_rank_starts(no_ranks, capsys, argv):
    assert main(argv) == 2
    assert "error" in capsys.readouterr().err


def test_argparse_errors_exit_2():
    with pytest.raises(SystemExit) as exc:
        main(["tp", "vocab", "--reduction", "avg"])
    assert exc.value.code == 2
