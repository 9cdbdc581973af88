"""The linter's rules (pyproject.toml's [tool.ruff]: errors, unused names, line length) hold on the
whole repository: a 300-line module cannot hide behind 200-character lines."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_would_flag_a_long_line(tmp_path):
    long_line = tmp_path / "long.py"
    long_line.write_text("x = " + "1 + " * 40 + "1\n")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--config",
                           str(ROOT / "pyproject.toml"), str(long_line)], capture_output=True,
                          text=True)
    assert done.returncode == 1 and "E501" in done.stdout, done.stdout + done.stderr
