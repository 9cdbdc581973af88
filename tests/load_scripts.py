"""The project's scripts (benchmarks/, scripts/) as modules a test can call into."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(path: str) -> ModuleType:
    """``path`` (relative to the repository, e.g. ``"benchmarks/slow_machine.py"``), loaded afresh."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
