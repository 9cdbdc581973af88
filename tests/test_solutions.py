"""Every exercise's folded solution is accepted by its own checker, and the stub is not.

The course's exercise convention: a markdown cell headed ``### Exercise N · Title``; then the
student's stub (a code cell that runs as saved); then the check cell, which prints exactly one line,
``✔ Exercise N: correct`` or ``✘ Exercise N: not yet — <hint>``; then a markdown cell holding the
solution in a ``<details><summary>Solution</summary>`` fold with one ```python block that replaces
the stub whole. An exercise answered in words has only the fold.

For each notebook in FOLLOWS_CONVENTION this module (1) reads the structure, (2) checks that as
saved every check cell printed its ``✘`` line, and (3) executes the notebook once, top to bottom in
a fresh kernel, with every stub replaced by its solution, and checks that every check cell printed
its ``✔`` line. FOLLOWS_CONVENTION is every notebook of the course. Marked slow and notebook, like
the nbval runs (tests/conftest.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = [pytest.mark.slow, pytest.mark.notebook]

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
FOLLOWS_CONVENTION = sorted(p.name for p in NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))

HEADING = re.compile(r"^### Exercise (\d+) · \S", re.MULTILINE)
FOLD = "<details><summary>Solution</summary>"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


@dataclass
class Exercise:
    number: int
    stub: int | None = None       # cell indices; None for an exercise answered in words
    check: int | None = None
    solution_code: str | None = None


def exercises(nb) -> tuple[list[Exercise], list[str]]:
    """The notebook's exercises and what breaks the convention in them."""
    found, problems = [], []
    cells = nb.cells
    for i, cell in enumerate(cells):
        m = HEADING.search(cell.source) if cell.cell_type == "markdown" else None
        if not m:
            continue
        ex = Exercise(int(m.group(1)))
        found.append(ex)
        nxt = cells[i + 1] if i + 1 < len(cells) else None
        if nxt is not None and nxt.cell_type == "markdown":          # answered in words
            if FOLD not in nxt.source:
                problems.append(f"Exercise {ex.number}: the cell after the question is neither a stub "
                                f"nor a folded solution")
            continue
        if i + 3 >= len(cells) or cells[i + 2].cell_type != "code" or cells[i + 3].cell_type != "markdown":
            problems.append(f"Exercise {ex.number}: expected stub, check cell, then the folded solution")
            continue
        ex.stub, ex.check = i + 1, i + 2
        fold = cells[i + 3].source
        code = PYTHON_BLOCK.search(fold)
        if FOLD not in fold or not code:
            problems.append(f"Exercise {ex.number}: the cell after the check is not a {FOLD} fold "
                            f"with a ```python block")
            continue
        ex.solution_code = code.group(1)
    numbers = [ex.number for ex in found]
    if numbers != list(range(1, len(numbers) + 1)):
        problems.append(f"exercises numbered {numbers}, not 1..{len(numbers)}")
    return found, problems


def printed(cell) -> list[str]:
    """The lines a code cell printed (stdout), as saved or as just executed."""
    text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
    return text.splitlines()


def verdict_problems(nb, found: list[Exercise], expect: str) -> list[str]:
    """Each check cell printed exactly one line: ``✔ Exercise N: correct`` (expect='✔') or
    ``✘ Exercise N: not yet — <hint>`` (expect='✘')."""
    problems = []
    for ex in found:
        if ex.check is None:
            continue
        lines = printed(nb.cells[ex.check])
        good = (lines == [f"✔ Exercise {ex.number}: correct"] if expect == "✔" else
                len(lines) == 1 and re.fullmatch(rf"✘ Exercise {ex.number}: not yet — \S.*", lines[0]))
        if not good:
            problems.append(f"Exercise {ex.number}: the check printed {lines}, expected one {expect} line")
    return problems


def run_with_solutions(path: Path, timeout: int = 900):
    """The notebook executed once in a fresh kernel with every stub replaced by its solution."""
    nb = nbformat.read(path, as_version=4)
    found, problems = exercises(nb)
    assert not problems, f"{path.name}: " + "; ".join(problems)
    for ex in found:
        if ex.stub is not None:
            nb.cells[ex.stub].source = ex.solution_code
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb, found


@pytest.mark.parametrize("name", FOLLOWS_CONVENTION)
def test_saved_checks_say_not_yet(name):
    nb = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    found, problems = exercises(nb)
    assert found and not problems, f"{name}: " + "; ".join(problems or ["no exercise found"])
    problems = verdict_problems(nb, found, "✘")
    assert not problems, f"{name} as saved: " + "; ".join(problems)


@pytest.mark.parametrize("name", FOLLOWS_CONVENTION)
def test_solutions_pass_their_checks(name):
    nb, found = run_with_solutions(NOTEBOOK_DIR / name)
    problems = verdict_problems(nb, found, "✔")
    assert not problems, f"{name} with the solutions: " + "; ".join(problems)


# ------------------------------------------------------------ the harness catches a wrong solution

CHECK = """\
try:
    ok = [double(x) for x in (0, 1, 5)] == [0, 2, 10]
except Exception:
    ok = False
print("✔ Exercise 1: correct" if ok else "✘ Exercise 1: not yet — double(5) should be 10")"""


def _tiny_notebook(solution: str):
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [md("### Exercise 1 · Double it\n\nWrite `double(x)`."),
                code("def double(x):\n    ...  # your code here"),
                code(CHECK),
                md(f"{FOLD}\n\nAdd it to itself.\n\n```python\n{solution}\n```\n</details>"),
                md("### Exercise 2 · In words\n\nWhy?"),
                md(f"{FOLD}\n\nBecause.\n</details>")]
    return nb


def test_harness_accepts_a_right_solution_and_catches_a_wrong_one(tmp_path):
    right, wrong = tmp_path / "right.ipynb", tmp_path / "wrong.ipynb"
    nbformat.write(_tiny_notebook("def double(x):\n    return x + x"), right)
    nbformat.write(_tiny_notebook("def double(x):\n    return 3 * x"), wrong)
    nb, found = run_with_solutions(right, timeout=120)
    assert [ex.number for ex in found] == [1, 2] and verdict_problems(nb, found, "✔") == []
    nb, found = run_with_solutions(wrong, timeout=120)
    assert verdict_problems(nb, found, "✔") == [
        "Exercise 1: the check printed ['✘ Exercise 1: not yet — double(5) should be 10'], "
        "expected one ✔ line"]


def test_harness_catches_a_stub_that_the_check_accepts():
    nb = _tiny_notebook("def double(x):\n    return x + x")
    found, _ = exercises(nb)
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", name="stdout", text="✔ Exercise 1: correct\n")]
    assert verdict_problems(nb, found, "✘") == [
        "Exercise 1: the check printed ['✔ Exercise 1: correct'], expected one ✘ line"]


@pytest.mark.parametrize("breaks, message", [
    (lambda nb: nb.cells.pop(2), "expected stub, check cell, then the folded solution"),
    (lambda nb: setattr(nb.cells[3], "source", "Solution: return x + x"), "fold with a ```python block"),
    (lambda nb: setattr(nb.cells[5], "source", "Because."), "neither a stub nor a folded solution"),
    (lambda nb: setattr(nb.cells[4], "source", "### Exercise 3 · In words"), "numbered [1, 3]"),
])
def test_structure_check_catches_a_broken_exercise(breaks, message):
    nb = _tiny_notebook("def double(x):\n    return x + x")
    breaks(nb)
    _, problems = exercises(nb)
    assert any(message in p for p in problems), problems
