"""Print the package tree as built, one line per file, from each module's first docstring line.

    python scripts/package_map.py            # the tree CONTRIBUTING.md opens with
    python scripts/package_map.py --check    # exit 1 naming files CONTRIBUTING.md does not list

The tree in CONTRIBUTING.md is this script's output; tests/test_layering.py checks that it names
every file of the package, so a new module cannot land without its line.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mtb_helpers"
CONTRIBUTING = ROOT / "CONTRIBUTING.md"


def first_line(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    line = doc.strip().splitlines()[0] if doc.strip() else ""
    return line.rstrip(".:")


def files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def tree() -> str:
    lines = ["mtb_helpers/"]
    current = None
    for path in files():
        rel = path.relative_to(PACKAGE)
        folder = rel.parent.as_posix() if rel.parent != Path(".") else ""
        if folder != current and folder:
            lines.append(f"  {folder}/")
        current = folder
        indent = "    " if folder else "  "
        lines.append(f"{indent}{rel.name:<18} {first_line(path)}".rstrip())
    return "\n".join(lines)


def unlisted(text: str) -> list[str]:
    """Package files whose ``folder/`` heading and name do not both appear in ``text``'s tree."""
    missing = []
    for path in files():
        rel = path.relative_to(PACKAGE)
        if f" {rel.name} " not in text and not any(
                line.strip().startswith(rel.name) for line in text.splitlines()):
            missing.append(rel.as_posix())
        elif rel.parent != Path(".") and f"{rel.parent.as_posix()}/" not in text:
            missing.append(rel.as_posix())
    return missing


if __name__ == "__main__":
    if "--check" in sys.argv:
        gone = unlisted(CONTRIBUTING.read_text())
        print("\n".join(gone) or "every package file is listed")
        sys.exit(1 if gone else 0)
    print(tree())
