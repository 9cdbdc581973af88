"""``minitrainbench pp bubble`` refuses what no figure can show and times that mean nothing:
exit 2 with one line on stderr, before any schedule is built (fault 6 of issue 15)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from mtb_helpers.cli import main
from mtb_helpers.pp import cli as pp_cli


@pytest.mark.parametrize("argv, words", [
    (["--stages", "100000", "--microbatches", "100000"], ["--stages", "100000"]),
    (["--stages", "4", "--microbatches", "100000"], ["--microbatches", "100000"]),
    (["--stages", "16", "--microbatches", "128"], ["16", "128"]),
    (["--schedule", "interleaved", "--stages", "4", "--microbatches", "8", "--chunks", "1000"],
     ["--chunks", "1000"]),
    (["--forward", "0", "--backward", "0"], ["--forward", "0"]),
    (["--backward", "-1"], ["--backward", "-1"]),
    (["--forward", "nan"], ["--forward", "nan"]),
    (["--backward", "inf"], ["--backward", "inf"]),
    (["--latency", "nan"], ["--latency", "nan"]),
    (["--latency", "-0.5"], ["--latency", "-0.5"]),
    (["--schedule", "zb-h1", "--input", "0", "--weight", "1"], ["--input", "0"]),
    (["--schedule", "zb-h1", "--input", "1", "--weight", "inf"], ["--weight", "inf"]),
])
def test_bad_sizes_and_times_exit_2_with_one_line_naming_them(argv, words, capsys, monkeypatch):
    def never(*a, **k):
        raise AssertionError("the schedule was built before the arguments were checked")

    monkeypatch.setattr(pp_cli, "schedule", never)
    assert main(["pp", "bubble", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minitrainbench: error:")
    for word in words:
        assert word in lines[0]


def test_the_largest_allowed_pipeline_still_runs_and_plots(tmp_path, capsys):
    out = tmp_path / "big.png"
    assert main(["pp", "bubble", "--stages", str(pp_cli.MAX_BUBBLE_STAGES), "--microbatches",
                 str(pp_cli.MAX_BUBBLE_OPS // pp_cli.MAX_BUBBLE_STAGES), "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "bubble fraction" in capsys.readouterr().out


def test_the_command_line_itself_exits_2_without_a_traceback():
    out = subprocess.run([sys.executable, "-m", "mtb_helpers.cli", "pp", "bubble", "--forward",
                          "0", "--backward", "0"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
