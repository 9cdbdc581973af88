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
