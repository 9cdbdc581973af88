"""The code a student reads is the code that runs (issue 34): every block of package source a
notebook prints with ``show_code(obj)`` is, as saved, a verbatim piece of the package today.

``show_code`` prints ``inspect.getsource(obj)``: a contiguous slice of one file, starting at a
``def``, a ``class`` or a decorator. A saved output that no longer matches (the package changed
and the notebook was not executed again) shows the student code that does not run. Read from the
saved notebooks and the source files; nothing is executed.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
START = re.compile(r"\s*(def |class |async def |@)")


def definitions(texts: list[str]) -> dict[str, list[list[str]]]:
    """Every def and class of the given source files (methods and nested ones too) as
    ``inspect.getsource`` prints it: its lines from the first decorator to its last line, with
    their indentation; keyed by that first line."""
    found: dict[str, list[list[str]]] = {}
    for text in texts:
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                block = lines[start - 1:node.end_lineno]
                found.setdefault(block[0], []).append(block)
    return found


DEFINITIONS = definitions([p.read_text() for p in sorted((ROOT / "mtb_helpers").rglob("*.py"))])


def shown_blocks(lines: list[str], defs: dict[str, list[list[str]]]) -> tuple[list[str], str | None]:
    """The package definitions at the start of a cell's printed output, in order, and the first
    printed line where one no longer matches the package (None when all match). Each is printed
    whole and followed by an empty line (``print(inspect.getsource(obj))``); the first line that
    starts no definition ends them (the cell's other output)."""
    blocks, i = [], 0
    while i < len(lines):
        if not lines[i].strip():
            i += 1
            continue
        if not START.match(lines[i]):
            break
        whole = [d for d in defs.get(lines[i], []) if lines[i:i + len(d)] == d
                 and (i + len(d) == len(lines) or not lines[i + len(d)].strip())]
        if not whole:
            return blocks, lines[i]
        block = max(whole, key=len)
        blocks.append("\n".join(block))
        i += len(block)
    return blocks, None


def _show_cells(path: Path):
    nb = json.loads(path.read_text())
    for n, cell in enumerate(nb["cells"]):
        src = "".join(cell["source"])
        if cell["cell_type"] != "code" or "show_code(" not in src or "def show_code" in src:
            continue
        text = "".join("".join(o.get("text", "")) for o in cell.get("outputs", [])
                       if o.get("output_type") == "stream" and o.get("name") == "stdout")
        yield n, src, text.splitlines()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_printed_block_is_the_package_source_today(path):
    for n, src, lines in _show_cells(path):
        blocks, stale = shown_blocks(lines, DEFINITIONS)
        where = f"{path.name} cell {n} ({src.strip().splitlines()[0][:60]})"
        assert stale is None, (
            f"{where} prints code the package no longer has, from this line: {stale!r}. Execute "
            "the notebook again (python scripts/execute_notebook.py) and rebuild its Chinese edition.")
        assert len(blocks) >= src.count("show_code("), (
            f"{where}: {src.count('show_code(')} show_code call(s) but {len(blocks)} printed "
            "definition(s) of the package at the top of its output")


def test_a_changed_line_a_lost_object_and_a_short_count_are_caught():
    defs = definitions(["class Ring:\n    def step(self, x):\n        y = x + 1\n        return y\n\n"
                        "    @staticmethod\n    def size(n):\n        return n\n"])
    method = ["    @staticmethod", "    def size(n):", "        return n", ""]
    assert shown_blocks(method + ["rank 0: 3"], defs) == (["\n".join(method[:3])], None)
    whole = ["class Ring:", "    def step(self, x):", "        y = x + 1", "        return y", "",
             "    @staticmethod", "    def size(n):", "        return n", ""]
    assert len(shown_blocks(whole + method, defs)[0]) == 2     # a class, then one of its methods
    # the saved output has a line the package lost
    assert shown_blocks(["    def step(self, x):", "        y = x + 2", "        return y", ""],
                        defs) == ([], "    def step(self, x):")
    # an object the package no longer has, after one it has
    assert shown_blocks(method + ["def gone():", "    pass", ""], defs)[1] == "def gone():"
    # a printed slice cut short (the package's def goes on) is not the whole definition
    assert shown_blocks(["    def step(self, x):", "        y = x + 1", ""], defs)[1] is not None
