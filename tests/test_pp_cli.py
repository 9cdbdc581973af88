"""``minitrainbench pp bubble``, through the real ``minitrainbench`` entry point: prints the op
order and numbers, writes the Gantt PNG, exits 2 on bad arguments. No ranks start."""
from __future__ import annotations

import json

import pytest

from mtb_helpers.cli import main


def test_bubble_prints_order_makespan_bubble_and_peaks(capsys):
    assert main(["pp", "bubble", "--schedule", "1f1b", "--stages", "3", "--microbatches", "4"]) == 0
    out = capsys.readouterr().out
    assert "stage 0: F0 F1 F2 B0 F3 B1 B2 B3" in out
    assert "stage 2: F0 B0 F1 B1 F2 B2 F3 B3" in out
    assert "makespan          18" in out  # (m + p - 1)(F + B) = 6 x 3
    assert "bubble fraction   0.3333" in out  # (p-1)/(m+p-1) = 2/6
    assert "peak activations  3 2 1" in out


def test_bubble_json_matches_the_simulator():
    import io
    from contextlib import redirect_stdout
    buf = io.StringIO()
    with redirect_stdout(buf):
        code = main(["pp", "bubble", "--schedule", "interleaved", "--stages", "2",
                     "--microbatches", "4", "--chunks", "2", "--json"])
    assert code == 0
    data = json.loads(buf.getvalue())
    assert data["ops"][1].startswith("F0c0 F1c0 F0c1 B0c1")
    assert data["bubble_ratio"] == pytest.approx((2 - 1) / (2 * 4))
    assert data["closed_form"]["bubble_fraction"] == pytest.approx(data["bubble_fraction"])
    assert data["peak_activations"] == [5, 3]


def test_bubble_zb_h1_takes_input_and_weight_times(capsys):
    assert main(["pp", "bubble", "--schedule", "zb-h1", "--stages", "4", "--microbatches", "8",
                 "--forward", "1", "--input", "1", "--weight", "1"]) == 0
    assert "makespan          27" in capsys.readouterr().out  # 3m + (p-1)(F+I-W)


def test_bubble_writes_the_gantt_png(tmp_path, capsys):
    out = tmp_path / "gantt.png"
    assert main(["pp", "bubble", "--schedule", "gpipe", "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000
    assert f"wrote {out}" in capsys.readouterr().out


@pytest.mark.parametrize("argv,reason", [
    (["--schedule", "interleaved", "--stages", "4", "--microbatches", "6"], "divisible"),
    (["--stages", "0"], "stages"),
    (["--microbatches", "-2"], "microbatches"),
    (["--schedule", "1f1b", "--chunks", "2"], "interleaved"),
    (["--forward", "-1"], "forward"),
    (["--schedule", "1f1b", "--weight", "1"], "zb-h1"),
])
def test_bad_arguments_exit_2_with_the_reason(argv, reason, capsys):
    assert main(["pp", "bubble", *argv]) == 2
    captured = capsys.readouterr()
    assert reason in captured.out + captured.err


@pytest.mark.parametrize("argv", [["--schedule", "pipedream"], ["--stages", "four"]])
def test_argparse_refusals_exit_2(argv):
    with pytest.raises(SystemExit) as info:
        main(["pp", "bubble", *argv])
    assert info.value.code == 2


def test_the_installed_command_exits_0_and_2():
    import subprocess
    import sys
    ok = subprocess.run([sys.executable, "-m", "mtb_helpers.cli", "pp", "bubble", "--stages", "2",
                         "--microbatches", "2"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "stage 1: F0 B0 F1 B1" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "mtb_helpers.cli", "pp", "bubble", "--stages", "0"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "stages must be a positive integer" in bad.stderr
