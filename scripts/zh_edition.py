"""The Chinese edition: notebooks/zh/NN_x.ipynb built from the English notebook and its translation.

    python scripts/zh_edition.py template notebooks/05_pipeline_bubble.ipynb   # add missing cells
    python scripts/zh_edition.py build [notebooks/05_pipeline_bubble.ipynb ...]  # (re)write zh copies
    python scripts/zh_edition.py check                                            # exit 1 on drift

Run from the repository root. One source of truth for code: a Chinese notebook's code cells, their
outputs and the notebook's metadata are the English notebook's, byte for byte; only the markdown
cells differ. Their translations live in ``notebooks/zh/translations/NN_x.md``, one section per
markdown cell, in a form a translator edits as plain markdown:

    <!-- cell 925b7ed6 · en 3f2a9c1b7d0e -->
    ## 1 · 为什么要切分权重 ...

``cell`` is the English cell's id and ``en`` the first 12 hex digits of the SHA-256 of the English
cell's source when it was translated. When the English cell changes, its hash no longer matches and
``check`` names the cell, so a translation cannot silently fall behind. ``template`` appends a
section (holding the English text, to be replaced) for every markdown cell that has none, and
``build`` refuses a notebook while any of its cells is untranslated or stale.
"""
from __future__ import annotations

import copy
import hashlib
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
EN_DIR = ROOT / "notebooks"
ZH_DIR = EN_DIR / "zh"
TRANSLATIONS = ZH_DIR / "translations"
MARKER = re.compile(r"^<!-- cell (\S+) · en ([0-9a-f]{12}) -->$", re.MULTILINE)
CJK = re.compile(r"[\u4e00-\u9fff]")


def en_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:12]


def english_notebooks(en_dir: Path = EN_DIR) -> list[Path]:
    return sorted(en_dir.glob("[0-9][0-9]_*.ipynb"))


def read_translations(path: Path) -> dict[str, tuple[str, str]]:
    """``{cell id: (en hash, translated markdown)}`` from one translation file (empty if none)."""
    if not path.exists():
        return {}
    text = path.read_text(encoding="utf-8")
    marks = list(MARKER.finditer(text))
    out: dict[str, tuple[str, str]] = {}
    for m, nxt in zip(marks, marks[1:] + [None]):
        body = text[m.end():nxt.start() if nxt else len(text)].strip("\n")
        if m.group(1) in out:
            raise ValueError(f"{path.name}: cell {m.group(1)} is translated twice")
        out[m.group(1)] = (m.group(2), body)
    return out


def problems(en_path: Path, zh_dir: Path = ZH_DIR) -> list[str]:
    """Everything that keeps ``zh_dir/<name>`` from being the English notebook plus its translation."""
    name = en_path.name
    en = nbformat.read(en_path, as_version=4)
    try:
        tr = read_translations(zh_dir / "translations" / f"{en_path.stem}.md")
    except ValueError as exc:
        return [str(exc)]
    found = []
    for cell in en.cells:
        if cell.cell_type != "markdown":
            continue
        if cell.id not in tr:
            found.append(f"{name}: markdown cell {cell.id} has no translation")
        elif tr[cell.id][0] != en_hash(cell.source):
            found.append(f"{name}: markdown cell {cell.id} changed in English since it was translated "
                         f"(en {tr[cell.id][0]}, now {en_hash(cell.source)})")
        elif not CJK.search(tr[cell.id][1]):
            found.append(f"{name}: markdown cell {cell.id} is still in English")
    ids = {c.id for c in en.cells if c.cell_type == "markdown"}
    found += [f"{name}: translation of cell {i}, which the English notebook no longer has"
              for i in tr if i not in ids]
    zh_path = zh_dir / name
    if not zh_path.exists():
        return found + [f"{name}: no Chinese notebook (run scripts/zh_edition.py build)"]
    zh = nbformat.read(zh_path, as_version=4)
    if [c.id for c in zh.cells] != [c.id for c in en.cells]:
        return found + [f"{name}: the Chinese notebook's cells are not the English ones (rebuild it)"]
    if zh.metadata != en.metadata:
        found.append(f"{name}: the Chinese notebook's metadata differs from the English (rebuild it)")
    code = [e.id for e, z in zip(en.cells, zh.cells) if e.cell_type != "markdown" and z != e]
    if code:
        found.append(f"{name}: {len(code)} code cell(s) or their outputs differ from the English, "
                     f"first {code[0]} (rebuild it)")
    found += [f"{name}: markdown cell {e.id} is not its translation (rebuild it)"
              for e, z in zip(en.cells, zh.cells)
              if e.cell_type == "markdown" and e.id in tr and z.source != tr[e.id][1]]
    return found


def build(en_path: Path, zh_dir: Path = ZH_DIR) -> Path:
    """Write ``zh_dir/<name>``: the English notebook with every markdown cell translated."""
    tr = read_translations(zh_dir / "translations" / f"{en_path.stem}.md")
    en = nbformat.read(en_path, as_version=4)
    missing = [p for p in problems(en_path, zh_dir) if "Chinese notebook" not in p and "rebuild" not in p]
    if missing:
        raise SystemExit("refusing to build:\n  " + "\n  ".join(missing))
    zh = copy.deepcopy(en)
    for cell in zh.cells:
        if cell.cell_type == "markdown":
            cell.source = tr[cell.id][1]
    out = zh_dir / en_path.name
    nbformat.write(zh, out)
    return out


def template(en_path: Path, zh_dir: Path = ZH_DIR) -> int:
    """Append a section, holding the English text, for each markdown cell without a translation."""
    path = zh_dir / "translations" / f"{en_path.stem}.md"
    tr = read_translations(path)
    en = nbformat.read(en_path, as_version=4)
    new = [f"<!-- cell {c.id} · en {en_hash(c.source)} -->\n{c.source}\n"
           for c in en.cells if c.cell_type == "markdown" and c.id not in tr]
    if new:
        path.parent.mkdir(parents=True, exist_ok=True)
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        path.write_text(old + ("\n" if old else "") + "\n".join(new), encoding="utf-8")
    return len(new)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("template", "build", "check"):
        print(__doc__, file=sys.stderr)
        return 2
    paths = [Path(a) for a in argv[1:]] or english_notebooks()
    if argv[0] == "template":
        for p in paths:
            print(f"{p.name}: {template(p)} cell(s) to translate")
    elif argv[0] == "build":
        for p in paths:
            print(f"wrote {build(p).relative_to(ROOT)}")
    else:
        found = [msg for p in paths for msg in problems(p)]
        print("\n".join(found) if found else f"the Chinese edition is in step ({len(paths)} notebooks)")
        return 1 if found else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
