"""The installed ``minitrainbench`` command: every command registered, exit codes 0 / 1 / 2."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from mtb_helpers.cli import build_parser


def minitrainbench(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("minitrainbench")
    assert exe, "the console script is not installed (pip install -e .)"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=300)


def test_every_documented_command_is_registered():
    parser = build_parser()
    for argv in (["collectives"], ["tp", "check"], ["tp", "mlp"], ["tp", "sequence"],
                 ["pp", "bubble"]):
        assert callable(parser.parse_args(argv).func), argv


@pytest.mark.parametrize("args, code", [
    (("tp", "mlp", "--world-size", "2"), 0),
    (("tp", "mlp", "--bug", "row-missing-allreduce"), 1),
    (("tp", "mlp", "--world-size", "9"), 2),          # refused before any rank starts
    (("tp", "mlp", "--ffn-hidden", "7"), 2),          # 7 does not divide by 2 ranks
    (("pp", "bubble", "--schedule", "zigzag"), 2),    # unknown schedule name
    (("no-such-command",), 2),
])
def test_console_script_exit_codes(args, code):
    out = minitrainbench(*args)
    assert out.returncode == code, out.stdout[-2000:] + out.stderr[-2000:]
    if code == 2:
        assert "error" in out.stderr


def test_every_command_ends_with_json_and_keeps_the_options_it_declares():
    """add_command builds every command: its common options, its own in order, then --json."""
    parser = build_parser()
    check = parser.parse_args(["tp", "check"])
    assert (check.world_size, check.dtype, check.seed, check.bug, check.batch_shape,
            check.gather_output, check.json) == (2, "float32", 0, None, [2, 3], False, False)
    grid = parser.parse_args(["grid", "check", "--lr", "0.5", "--json"])
    assert (grid.world_size, grid.lr, grid.json) == (4, 0.5, True)
    bubble = parser.parse_args(["pp", "bubble", "--input", "1.5"])
    assert (bubble.input, bubble.weight, bubble.chunks, bubble.schedule) == (1.5, None, None, "1f1b")
    subcommands = [a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict)]
    for group in subcommands[0].choices.values():
        leaves = [a.choices.values() for a in group._actions
                  if hasattr(a, "choices") and isinstance(a.choices, dict)] or [[group]]
        for command in (c for leaf in leaves for c in leaf):
            assert command._actions[-1].option_strings == ["--json"], command.prog


@pytest.mark.parametrize("rank, written", [("0", True), ("1", False)])
def test_save_figure_draws_from_rank_0_only(tmp_path, monkeypatch, rank, written):
    import matplotlib.pyplot as plt

    from mtb_helpers.checking.command import save_figure

    monkeypatch.setenv("RANK", rank)
    path = tmp_path / "out.png"
    save_figure(lambda: plt.figure(figsize=(1, 1)), str(path))
    assert path.exists() is written
    if written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
