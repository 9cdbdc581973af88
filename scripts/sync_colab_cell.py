"""Rewrite the first code cell of every notebook (the Colab install cell) from pyproject.toml.

    python scripts/sync_colab_cell.py                 # every notebooks/*.ipynb and README.md
    python scripts/sync_colab_cell.py --check         # exit 1 if anything would change
    python scripts/sync_colab_cell.py NB.ipynb ... [--pyproject P] [--readme R]

The repository address is set in one place, ``[project.urls] Repository`` in pyproject.toml; this
cell and the README's Colab and Binder links follow it. Only the cell's source changes: outputs,
execution counts and metadata stay as they are, so a synced notebook is still "executed top to
bottom" without running it again (the cell prints nothing where the package is installed).
"""
from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]

# The first line identifies the cell; keep it stable so an old cell can be found and replaced.
MARKER = "# Colab or a fresh kernel: install the course package if it is missing"
TEMPLATE = (
    MARKER + " (torch and ipywidgets stay as they are).\n"
    "import importlib.util\n"
    'if importlib.util.find_spec("mtb_helpers") is None:\n'
    '    %pip install -q "mtb_helpers @ git+{url}"'
)


def repository_url(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """``[project.urls] Repository`` without a trailing slash or ``.git``."""
    with open(pyproject, "rb") as f:
        url = tomllib.load(f)["project"]["urls"]["Repository"]
    url = url.rstrip("/")
    return url[:-4] if url.endswith(".git") else url


def colab_cell_source(url: str) -> str:
    """The exact source of the install cell for repository ``url``."""
    return TEMPLATE.format(url=url)


def sync(path: Path, url: str, write: bool = True) -> bool:
    """Make the first code cell of ``path`` the install cell for ``url``; True if it changed.

    Raises ValueError when the first code cell is something else: inserting a cell would shift
    every execution count, so the notebook has to be fixed (and re-executed) by hand.
    """
    nb = nbformat.read(path, as_version=4)
    first = next((c for c in nb.cells if c.cell_type == "code"), None)
    if first is None or not first.source.startswith(MARKER):
        raise ValueError(f"{path}: the first code cell is not the Colab install cell "
                         f"(it must start with {MARKER!r})")
    wanted = colab_cell_source(url)
    if first.source == wanted:
        return False
    first.source = wanted
    if write:
        nbformat.write(nb, path)
    return True


def sync_readme(path: Path, url: str, write: bool = True) -> bool:
    """Point the README's Colab and Binder links at ``url``; True if it changed."""
    if not url.startswith("https://github.com/"):
        raise ValueError(f"Colab and Binder open GitHub repositories; Repository is {url}")
    owner_repo = url.removeprefix("https://github.com/")
    text = path.read_text()
    new = re.sub(r"(colab\.research\.google\.com/github/|mybinder\.org/v2/gh/)[^/\s]+/[^/\s]+/",
                 lambda m: f"{m.group(1)}{owner_repo}/", text)
    if new == text:
        return False
    if write:
        path.write_text(new)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to sync (default: notebooks/*.ipynb)")
    parser.add_argument("--pyproject", type=Path, default=ROOT / "pyproject.toml")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if some notebook is out of date")
    args = parser.parse_args(argv)
    url = repository_url(args.pyproject)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    stale = []
    for path in paths:
        try:
            changed = sync(path, url, write=not args.check)
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 2
        if changed:
            stale.append(path)
            print(f"{'out of date' if args.check else 'updated'}: {path}")
    try:
        if sync_readme(args.readme, url, write=not args.check):
            stale.append(args.readme)
            print(f"{'out of date' if args.check else 'updated'}: {args.readme}")
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
