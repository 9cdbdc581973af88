"""Every module of ``mtb_helpers`` imports when it is the FIRST one a program imports.

The layering test reads imports from the source; it does not see that importing ``a.b.c`` runs
``a/b/__init__.py`` first, so a package's re-exports can close a circle that only shows for one
import order (``import mtb_helpers.attention`` in a fresh interpreter once failed: attention's
layers import tp.layers, whose package re-exported attention's half-loaded layers).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Imports each module of a package with no module of it loaded (torch stays loaded: that is the
# slow part and not what is checked); prints each failure as "name: error".
IMPORT_EACH_FIRST = textwrap.dedent("""
    import importlib, pkgutil, sys
    import torch  # noqa: F401
    package = sys.argv[1]
    root = importlib.import_module(package)
    names = sorted(m.name for m in pkgutil.walk_packages(root.__path__, package + ".",
                                                         onerror=lambda name: None)
                   if not m.name.endswith("__main__"))
    for name in [package, *names]:
        for loaded in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
            del sys.modules[loaded]
        try:
            importlib.import_module(name)
        except Exception as exc:
            print(f"{name}: {type(exc).__name__}: {exc}")
    print(f"imported {len(names) + 1} modules")
""")


def failures_importing_each_first(package: str, path: Path) -> tuple[list[str], str]:
    proc = subprocess.run([sys.executable, "-c", IMPORT_EACH_FIRST, package], cwd=path,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(path), "MPLBACKEND": "Agg"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    return lines[:-1], lines[-1]


def test_every_module_of_the_package_imports_first():
    failed, summary = failures_importing_each_first("mtb_helpers", REPO)
    assert failed == [], "\n".join(failed)
    assert int(summary.split()[1]) > 150, summary   # it did walk the whole package


def test_a_circle_through_a_package_reexport_is_found(tmp_path):
    # the shape of the bug: low/__init__ re-exports high.layers; high.layers imports low.layers
    for path, text in {"planted/__init__.py": "",
                       "planted/low/__init__.py": "from planted.low.layers import Linear\n"
                                                  "from planted.high.layers import Attention\n",
                       "planted/low/layers.py": "class Linear: pass\n",
                       "planted/high/__init__.py": "from planted.high.layers import Attention\n",
                       "planted/high/layers.py": "from planted.low.layers import Linear\n"
                                                 "class Attention(Linear): pass\n"}.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    failed, _ = failures_importing_each_first("planted", tmp_path)
    assert any(line.startswith("planted.high: ImportError") for line in failed), failed
