"""The package map of docs/design.md: one line per file of ``mtb_helpers``, from each module's
first docstring line, folder by folder.

    python scripts/package_map.py            # print the map
    python scripts/package_map.py --write    # rewrite the map section of docs/design.md in place
    python scripts/package_map.py --check    # exit 1 naming, folder by folder, the files the map
                                             # lacks and the entries with no file

The map sits in docs/design.md between the two ``MARKERS`` lines; ``--write`` replaces only what
is between them. tests/test_design_map.py checks the map against the tree both ways, so a module
cannot land (or go) without its line; after adding or removing modules, ``--write`` is the one
command that brings the map up to date.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mtb_helpers"
DESIGN = ROOT / "docs" / "design.md"
MARKERS = ("<!-- package map: written by `python scripts/package_map.py --write` -->",
           "<!-- end of package map -->")
NAME_WIDTH = 18


def first_line(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    line = doc.strip().splitlines()[0] if doc.strip() else ""
    return line.rstrip(".:")


def files(package: Path = PACKAGE) -> list[Path]:
    return sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)


def tree(package: Path = PACKAGE) -> str:
    """The map: ``mtb_helpers/``, then each top-level file, then each folder (``  folder/``) with
    its files indented under it."""
    lines = [f"{package.name}/"]
    current = None
    for path in sorted(files(package), key=lambda p: (len(p.relative_to(package).parts) > 1,
                                                      p.relative_to(package).as_posix())):
        rel = path.relative_to(package)
        folder = rel.parent.as_posix() if rel.parent != Path(".") else ""
        if folder != current and folder:
            lines.append(f"  {folder}/")
        current = folder
        indent = "    " if folder else "  "
        lines.append(f"{indent}{rel.name:<{NAME_WIDTH}} {first_line(path)}".rstrip())
    return "\n".join(lines)


def section(text: str) -> tuple[int, int]:
    """(start, end) offsets of what lies between the markers in ``text``."""
    begin, end = text.find(MARKERS[0]), text.find(MARKERS[1])
    if begin < 0 or end < begin:
        raise ValueError(f"the package map's markers are missing from the design document: "
                         f"{MARKERS[0]!r} ... {MARKERS[1]!r}")
    return begin + len(MARKERS[0]), end


def listed(text: str) -> set[str]:
    """The paths (relative to the package, ``folder/name.py``) the map in ``text`` lists."""
    start, end = section(text)
    paths, folder = set(), ""
    for line in text[start:end].splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("```") or line == line.lstrip():
            continue   # the fence, blank lines and the ``mtb_helpers/`` heading
        if stripped.endswith("/") and " " not in stripped:
            folder = stripped
        elif line.startswith("    ") and folder:
            paths.add(folder + stripped.split()[0])
        else:
            folder = ""
            paths.add(stripped.split()[0])
    return paths


def differences(text: str, package: Path = PACKAGE) -> dict[str, tuple[list[str], list[str]]]:
    """{folder: (files the map lacks, map entries with no file)} for every folder where the map in
    ``text`` and the tree under ``package`` differ ("" is the package's top level)."""
    on_disk = {p.relative_to(package).as_posix() for p in files(package)}
    in_map = listed(text)
    found: dict[str, tuple[list[str], list[str]]] = {}
    for path in sorted(on_disk ^ in_map):
        folder = path.rpartition("/")[0]
        missing, extra = found.setdefault(folder, ([], []))
        (missing if path in on_disk else extra).append(path)
    return found


def report(diffs: dict[str, tuple[list[str], list[str]]]) -> str:
    lines = []
    for folder, (missing, extra) in diffs.items():
        where = f"{folder}/" if folder else "(top level)"
        if missing:
            lines.append(f"{where}: not in the map: {', '.join(missing)}")
        if extra:
            lines.append(f"{where}: in the map, no such file: {', '.join(extra)}")
    return "\n".join(lines)


def write(design: Path = DESIGN, package: Path = PACKAGE) -> None:
    text = design.read_text()
    start, end = section(text)
    design.write_text(text[:start] + "\n```\n" + tree(package) + "\n```\n" + text[end:])


if __name__ == "__main__":
    if "--write" in sys.argv:
        write()
        print(f"wrote the package map of {DESIGN.relative_to(ROOT)}")
    elif "--check" in sys.argv:
        diffs = differences(DESIGN.read_text())
        print(report(diffs) or "the map lists every package file, and nothing else")
        sys.exit(1 if diffs else 0)
    else:
        print(tree())
