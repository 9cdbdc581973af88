"""``minitrainbench tp sequence``: table, memory figures, --json, exit codes 0 / 1 / 2."""
from __future__ import annotations

import json

import pytest

from mtb_helpers.cli import main


def test_sequence_passes_and_prints_the_table_and_the_memory(capsys):
    assert main(["tp", "sequence", "--world-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "sequence_parallel [world_size=2" in out and "PASSED" in out
    for quantity in ("output", "dropout", "input_grad", "ln.weight_grad", "ln.bias_grad",
                     "fc1.weight_grad", "fc2.bias_grad"):
        assert quantity in out
    assert "max abs error over ranks: output" in out
    assert "LN in" in out and "SP+" in out and "Korthikanti" in out


def test_sequence_json_carries_rows_and_activation_memory(capsys):
    assert main(["tp", "sequence", "--world-size", "4", "--dtype", "float64", "--seq-len", "12",
                 "--ffn-hidden", "16", "--dropout", "0.2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (check,) = data["checks"]
    assert data["passed"] is True and check["check"] == "sequence_parallel"
    assert check["config"]["seq_len"] == 12 and check["config"]["dropout_p"] == 0.2
    mem = check["activation_memory"]["variants"]
    assert mem["sp"]["measured_total"] < mem["tp"]["measured_total"]


@pytest.mark.parametrize("bug", ["sp-no-layernorm-grad-allreduce", "sp-same-dropout-mask",
                                 "sp-allreduce-instead-of-reduce-scatter"])
def test_sequence_bug_exits_1(capsys, bug):
    assert main(["tp", "sequence", "--bug", bug, "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] is False and data["checks"][0]["config"]["bug"] == bug


@pytest.mark.parametrize("argv, message", [
    (["tp", "sequence", "--seq-len", "9"], "seq_len=9 is not divisible by the world size 2"),
    (["tp", "sequence", "--world-size", "3", "--seq-len", "9", "--ffn-hidden", "16"], "ffn_hidden=16"),
    (["tp", "sequence", "--bug", "bias-before-allreduce"], "does not apply"),
    (["tp", "sequence", "--dropout", "1.5"], "dropout_p"),
])
def test_sequence_bad_arguments_exit_2(capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_argparse_errors_exit_2():
    with pytest.raises(SystemExit) as exc:
        main(["tp", "sequence", "--dtype", "float16"])
    assert exc.value.code == 2
