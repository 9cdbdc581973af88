"""The course's text as a student meets it: short sentences, one notation, takeaways, answers that stay
hidden, and README times a student can keep.

Per notebook (markdown prose, measured by scripts/prose_stats.py, the project's own tool):
  (a) on average at most 17 words a sentence, at most 4 % of sentences over 35 words, none over 50;
  (b) the first markdown cell links the glossary (``glossary.md``, any link text);
  (c) the last cell is a ``## Takeaways`` markdown cell of 3-5 one-line bullets;
  (d) no code cell is hidden by ``jupyter.source_hidden`` (GitHub and Colab ignore it, so an answer
      hidden that way is in plain sight; solutions go in a markdown ``<details>`` fold).
(a)-(d) hold for every notebook of the course, a new one included.
  (e) README.md's course table gives every notebook a time within 5 minutes of its reading load
      (scripts/readme_times.py: prose words at 150 a minute, a minute a code cell, a minute a
      figure, 15 minutes an exercise). ``python scripts/readme_times.py --write`` regenerates the column.
Each check ships with a deliberately bad input it must reject.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from tests.load_scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
ALL_NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
prose_stats = load_script("scripts/prose_stats.py")
readme_times = load_script("scripts/readme_times.py")

REWRITTEN = [p.name for p in ALL_NOTEBOOKS]   # every notebook meets the targets

MAX_AVG, MAX_PCT_OVER35, MAX_LONGEST = 17, 4, 50
GLOSSARY_LINK = "[notation and glossary](glossary.md)"
LINKS_GLOSSARY = re.compile(r"\]\(glossary\.md(?:#[^)]*)?\)")   # any link text
BULLET = re.compile(r"^[*-] \S")


# ------------------------------------------------------------------------- the checks, one each

def prose_problems(nb) -> list[str]:
    """(a) the sentence targets, measured exactly as scripts/prose_stats.py measures them."""
    st = prose_stats.markdown_stats([c.source for c in nb.cells if c.cell_type == "markdown"])
    sentence, longest = st["longest"]
    found = []
    if st["avg"] > MAX_AVG:
        found.append(f"average {st['avg']} words a sentence (at most {MAX_AVG})")
    if st["pct_over35"] > MAX_PCT_OVER35:
        found.append(f"{st['pct_over35']} % of sentences over 35 words (at most {MAX_PCT_OVER35} %)")
    if longest > MAX_LONGEST:
        found.append(f"a sentence of {longest} words (at most {MAX_LONGEST}): {sentence[:120]}...")
    return found


def glossary_problems(nb) -> list[str]:
    """(b) the first markdown cell links the glossary, and the glossary is there."""
    first = next((c for c in nb.cells if c.cell_type == "markdown"), None)
    if first is None or not LINKS_GLOSSARY.search(first.source):
        return ["the first markdown cell does not link the glossary (glossary.md)"]
    if not (NOTEBOOK_DIR / "glossary.md").is_file():
        return ["notebooks/glossary.md is missing"]
    return []


def takeaways_problems(nb) -> list[str]:
    """(c) the last cell: ``## Takeaways`` and 3-5 bullets of one line each, nothing else."""
    last = nb.cells[-1] if nb.cells else None
    if last is None or last.cell_type != "markdown" or not last.source.startswith("## Takeaways"):
        return ["the last cell is not a markdown cell headed '## Takeaways'"]
    lines = [line for line in last.source.splitlines()[1:] if line.strip()]
    bullets = [line for line in lines if BULLET.match(line)]
    found = []
    if len(bullets) != len(lines):
        found.append(f"the takeaways hold lines that are not one-line bullets: {set(lines) - set(bullets)}")
    if not 3 <= len(bullets) <= 5:
        found.append(f"{len(bullets)} takeaways (3-5)")
    return found


def hidden_code_problems(nb) -> list[str]:
    """(d) no code cell hidden by JupyterLab's ``source_hidden``, which GitHub and Colab ignore."""
    return [f"code cell {i} is hidden only by jupyter.source_hidden" for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and c.metadata.get("jupyter", {}).get("source_hidden")]


CHECKS = [prose_problems, glossary_problems, takeaways_problems, hidden_code_problems]


@pytest.mark.parametrize("check", CHECKS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("name", REWRITTEN)
def test_rewritten_notebook_meets_the_text_targets(name, check):
    nb = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    found = check(nb)
    assert not found, f"{name}: " + "; ".join(found)


def test_rewritten_list_names_real_notebooks():
    names = {p.name for p in ALL_NOTEBOOKS}
    assert len(ALL_NOTEBOOKS) == 16 and set(REWRITTEN) <= names, set(REWRITTEN) - names


# ------------------------------------------------------------------- each check catches a mistake

def _good_notebook():
    """A tiny notebook that passes every check: glossary link, short sentences, takeaways."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell(f"# 99 · Title\n\nShort sentences help. See the {GLOSSARY_LINK}."),
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_markdown_cell("An all-reduce sums a tensor over ranks. Every rank gets the sum."),
        nbformat.v4.new_markdown_cell("## Takeaways\n\n- one\n- two\n- three"),
    ]
    return nb


def test_a_good_notebook_passes_every_check():
    nb = _good_notebook()
    assert [f.__name__ for f in CHECKS if f(nb)] == []


def test_prose_check_catches_a_long_sentence():
    nb = _good_notebook()
    nb.cells[2].source += " " + " ".join(["word"] * 51) + "."
    assert any("51 words" in p or "52 words" in p for p in prose_problems(nb)), prose_problems(nb)


def test_prose_check_catches_a_high_average():
    nb = _good_notebook()
    nb.cells[2].source = " ".join(["Thirty"] + ["words"] * 29 + ["."]) * 4   # 30 words: none over 35
    assert any("average" in p for p in prose_problems(nb)), prose_problems(nb)


def test_prose_check_catches_too_many_sentences_over_35_words():
    nb = _good_notebook()
    nb.cells[2].source = " ".join(["Long"] + ["words"] * 39) + ". " + "Short one here. " * 10
    assert any("over 35 words" in p for p in prose_problems(nb)), prose_problems(nb)


def test_prose_check_skips_code_maths_and_tables():
    nb = _good_notebook()
    long_code = " ".join(["x"] * 80)
    nb.cells[2].source += f"\n\n```python\n{long_code}\n```\n\n$$\n{long_code}\n$$\n\n| {long_code} |\n"
    assert prose_problems(nb) == []


def test_glossary_check_catches_a_missing_link():
    nb = _good_notebook()
    nb.cells[0].source = "# 99 · Title\n\nNo link to the notation here."
    assert glossary_problems(nb)


def test_glossary_check_reads_the_first_markdown_cell_only():
    nb = _good_notebook()
    nb.cells[0].source, nb.cells[2].source = nb.cells[2].source, nb.cells[0].source
    assert glossary_problems(nb)


@pytest.mark.parametrize("last", [
    "## Summary\n\n- one\n- two\n- three",                 # not headed Takeaways
    "## Takeaways\n\n- one\n- two",                        # too few
    "## Takeaways\n\n- 1\n- 2\n- 3\n- 4\n- 5\n- 6",        # too many
    "## Takeaways\n\n- one\n- two\n- three\n\nA paragraph after them.",
])
def test_takeaways_check_catches_a_wrong_last_cell(last):
    nb = _good_notebook()
    nb.cells[-1].source = last
    assert takeaways_problems(nb), last


def test_takeaways_check_catches_takeaways_that_are_not_last():
    nb = _good_notebook()
    nb.cells.append(nbformat.v4.new_code_cell("print('after')"))
    assert takeaways_problems(nb)


def test_hidden_code_check_catches_a_source_hidden_solution():
    nb = _good_notebook()
    nb.cells[1].metadata["jupyter"] = {"source_hidden": True}
    assert hidden_code_problems(nb) == ["code cell 1 is hidden only by jupyter.source_hidden"]


def test_prose_stats_command_flags_a_notebook_over_the_limits(tmp_path, capsys):
    good, bad = _good_notebook(), _good_notebook()
    bad.cells[2].source += " " + " ".join(["word"] * 60) + "."
    nbformat.write(good, tmp_path / "01_good.ipynb")
    assert prose_stats.main(["prose_stats.py", str(tmp_path), "17", "4"]) == 0
    nbformat.write(bad, tmp_path / "02_bad.ipynb")
    assert prose_stats.main(["prose_stats.py", str(tmp_path), "17", "4"]) == 1
    flagged = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.endswith("OVER")]
    assert flagged == ["02_bad.ipynb"], flagged


# -------------------------------------------------------------------------------- (e) README times

def _time_problems(readme: str) -> list[str]:
    given = readme_times.readme_times(readme)
    found = []
    for path in ALL_NOTEBOOKS:
        rel = str(path.relative_to(ROOT))
        if rel not in given:
            found.append(f"{rel}: no time in the README's course table")
            continue
        load = readme_times.load(path)
        if abs(given[rel] - load["raw_minutes"]) > 5:
            found.append(f"{rel}: the README says {given[rel]} min, its reading load is "
                         f"{load['raw_minutes']:.0f} min ({load['prose_words']} words, {load['code_cells']} "
                         f"code cells, {load['figures']} figures, {load['exercises']} exercises): "
                         f"run python scripts/readme_times.py --write")
    return found


def test_readme_times_match_the_reading_load():
    found = _time_problems((ROOT / "README.md").read_text())
    assert not found, "\n".join(found)


def test_readme_times_check_catches_a_wrong_time():
    readme = (ROOT / "README.md").read_text()
    path = "notebooks/05_pipeline_bubble.ipynb"
    line = next(line for line in readme.splitlines() if f"({path})" in line)
    cells = line.split(" | ")
    col = readme_times.readme_rows(readme)["__columns__"][1].index("time")
    wrong = readme_times.fmt(readme_times.readme_times(readme)[path] + 20)
    cells[col] = wrong
    found = _time_problems(readme.replace(line, " | ".join(cells)))
    assert len(found) == 1 and found[0].startswith(path), found


def test_readme_times_check_catches_a_missing_row():
    readme = (ROOT / "README.md").read_text()
    line = next(line for line in readme.splitlines() if "(notebooks/07_moe_all_to_all.ipynb)" in line)
    found = _time_problems(readme.replace(line + "\n", ""))
    assert found == ["notebooks/07_moe_all_to_all.ipynb: no time in the README's course table"]


def test_rewrite_sets_every_time_to_the_load():
    readme = (ROOT / "README.md").read_text()
    col = readme_times.readme_rows(readme)["__columns__"][1].index("time")
    scrambled = "\n".join(re.sub(r"\| (\d+ min|\d+ h(?: \d+)?) \|", "| 5 min |", line)
                          if line.startswith("| [") else line for line in readme.splitlines())
    assert _time_problems(scrambled), "scrambling every time must be caught"
    rebuilt = readme_times.rewrite(scrambled)
    assert _time_problems(rebuilt) == [] and col == 3


@pytest.mark.parametrize("text, minutes", [("45 min", 45), ("1 h", 60), ("1 h 25", 85), ("2 h 05", 125)])
def test_times_read_and_written_alike(text, minutes):
    assert readme_times.parse_time(text) == minutes and readme_times.fmt(minutes) == text


def test_a_time_that_is_not_a_time_is_refused():
    with pytest.raises(ValueError, match="not a time: '45 minutes'"):
        readme_times.parse_time("45 minutes")


def test_exercises_are_counted_in_every_form():
    assert readme_times.exercises(["### Exercise 1 · A\n\ntext", "### Exercise 2 · B"]) == 2
    assert readme_times.exercises(["**Exercise 1.** Write it.\n\n**Exercise 2.** And this."]) == 2
    assert readme_times.exercises(["## 7 · Exercises\n\n**1.** One.\n\n**2.** Two.\n\n**3.** Three."]) == 3
    assert readme_times.exercises(["## 8 · Exercise: all-gather by hand"]) == 1
    assert readme_times.exercises(["No exercise in here."]) == 0


def test_the_chinese_readme_gives_each_notebook_the_english_time():
    readme = (ROOT / "README.md").read_text()
    zh = (ROOT / "README.zh.md").read_text(encoding="utf-8")
    assert readme_times.rewrite_zh(zh, readme) == zh, "run python scripts/readme_times.py --write"
    # a drift is caught: change the first time in the Chinese table (whatever it is today)
    first = re.search(r"\| (\d+ 小时(?: \d+ 分)?|\d+ 分钟) \|", zh).group(1)
    wrong = zh.replace(f"| {first} |", f"| {first}0 |", 1)
    assert wrong != zh and readme_times.rewrite_zh(wrong, readme) != wrong
