"""``minitrainbench collectives``: table, --json, exit 0 on pass, 1 on a caught bug, 2 on bad
arguments, through the real ``mtb_helpers.cli.main``."""
from __future__ import annotations

import json

import pytest

import mtb_helpers.cli as cli


@pytest.fixture
def main():
    return cli.main


def test_passing_check_prints_a_table_and_exits_0(main, capsys):
    assert main(["collectives", "--world-size", "2", "--numel", "4"]) == 0
    out = capsys.readouterr().out
    assert "PASSED" in out
    for name in ("broadcast", "all-reduce", "all-gather", "reduce-scatter", "all-to-all"):
        assert name in out
    assert "sent (formula)" in out


def test_json_report(main, capsys):
    assert main(["collectives", "--world-size", "3", "--numel", "6", "--dtype", "float64",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] and len(out["checks"]) == 1  # the same shape as every check command
    data = out["checks"][0]
    assert data["passed"] and data["config"]["world_size"] == 3
    assert data["config"]["dtype"] == "float64"
    assert len(data["rows"]) == len(data["values"]) == 5 * 3


def test_injected_bug_exits_1(main, capsys):
    assert main(["collectives", "--bug", "reduce-scatter-wrong-chunk", "--collective",
                 "reduce-scatter"]) == 1
    assert "FAIL" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["collectives", "--numel", "3"],                     # not divisible by 2 ranks
    ["collectives", "--world-size", "9"],
    ["collectives", "--bug", "no-such-bug"],
])
def test_bad_values_exit_2(main, capsys, argv):
    assert main(argv) == 2
    assert "error" in capsys.readouterr().err


def test_unparsable_arguments_exit_2(main):
    with pytest.raises(SystemExit) as info:
        main(["collectives", "--numel", "many"])
    assert info.value.code == 2
