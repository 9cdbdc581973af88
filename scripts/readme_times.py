"""The time column of README.md's course table, computed from each notebook's reading load.

A student reads prose at 150 words a minute (the prose words scripts/prose_stats.py counts), spends
a minute on each code cell (read it, run it, look at its output), another minute on each figure a
cell draws (the figures carry the lesson: a student compares them with the text) and 15 minutes on
each exercise (the top of the 10-15 a short coding or predicting exercise takes). The sum is
rounded to the nearest 5 minutes.

Calibrated against two students' readings of notebooks 00-05 (session 13, helpers reading every
sentence, figure and exercise): they took 60-130 minutes a notebook. Prose, cells and 12-minute
exercises alone predicted 15-30 % less than that for every notebook; with a minute per figure and
15-minute exercises the prediction is within 10 % for 00-03 and 5, and 14 % under for 04 (its memory
tables). Re-read a notebook as a student and compare before changing these constants.

Usage: python scripts/readme_times.py           print each notebook's load and time beside the README's
       python scripts/readme_times.py --write   rewrite the time column of README.md's table from the
                                                notebooks, and README.zh.md's (the same minutes, in Chinese)
tests/test_course_text.py checks that the README's times are within 5 minutes of these.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prose_stats import nb_stats  # noqa: E402  (the script's own folder, whether run or imported)

ROOT = Path(__file__).resolve().parents[1]
WORDS_PER_MINUTE = 150
MINUTES_PER_CODE_CELL = 1
MINUTES_PER_FIGURE = 1
MINUTES_PER_EXERCISE = 15
# a table row of the README's course table: | [NN · title](notebooks/NN_x.ipynb) | ... | 45 min | ... |
ROW = re.compile(r"^\| \[(?P<nn>\d\d) [^|]*\]\((?P<path>notebooks/\d\d_[\w]+\.ipynb)\) \|")
TIME = re.compile(r"^(\d+) min$|^(\d+) h(?: (\d+))?$")


def exercises(markdown_cells: list[str]) -> int:
    """How many exercises a notebook asks: ``### Exercise N`` headings (the course's convention), or
    older forms (``**Exercise N.**``, ``**N.**`` under an Exercises heading, one unnumbered
    ``Exercise:`` heading), or folded solutions, whichever counts most."""
    numbered: set[int] = set()
    bare: set[int] = set()
    unnumbered = folds = 0
    in_section = False
    for md in markdown_cells:
        folds += len(re.findall(r"<summary>\s*Solution", md))
        for line in md.splitlines():
            if re.match(r"^#+\s", line):
                in_section = bool(re.search(r"\bExercises?\b", line))
                if re.search(r"\bExercise\b(?!s)", line) and not re.search(r"Exercise \d", line):
                    unnumbered += 1
            numbered.update(int(x) for x in re.findall(r"^(?:#+\s*|\*\*)Exercise (\d+)", line))
            if in_section:
                bare.update(int(x) for x in re.findall(r"^\*\*(\d+)\.\*\*", line))
    return max(len(numbered), len(bare), unnumbered, folds)


def load(path: Path) -> dict:
    """The reading load of one saved notebook: prose words, code cells, exercises, and the minutes."""
    nb = json.loads(Path(path).read_text())
    md = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"]
    st = nb_stats(str(path))
    n_ex = exercises(md)
    n_fig = figures(nb)
    raw = (st["prose_words"] / WORDS_PER_MINUTE + st["code_cells"] * MINUTES_PER_CODE_CELL
           + n_fig * MINUTES_PER_FIGURE + n_ex * MINUTES_PER_EXERCISE)
    return dict(prose_words=st["prose_words"], code_cells=st["code_cells"], figures=n_fig,
                exercises=n_ex, raw_minutes=raw, minutes=5 * round(raw / 5))


def figures(nb: dict) -> int:
    """Figures the saved notebook shows: PNG outputs of its code cells (an explorer's live figure is
    not saved as one, and is counted with its cell)."""
    return sum("image/png" in o.get("data", {})
               for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", []))


def fmt(minutes: int) -> str:
    """45 -> '45 min', 75 -> '1 h 15', 60 -> '1 h'."""
    if minutes < 60:
        return f"{minutes} min"
    h, m = divmod(minutes, 60)
    return f"{h} h {m:02d}" if m else f"{h} h"


def parse_time(text: str) -> int:
    """'45 min' -> 45, '1 h 15' -> 75, '1 h' -> 60; ValueError on anything else."""
    m = TIME.match(text.strip())
    if not m:
        raise ValueError(f"not a time: {text!r} (write '45 min' or '1 h 15')")
    if m.group(1):
        return int(m.group(1))
    return 60 * int(m.group(2)) + int(m.group(3) or 0)


def readme_rows(readme: str) -> dict[str, tuple[int, list[str]]]:
    """{notebook path: (line index, cells)} for each row of the course table; the time is the cell
    after the prerequisites (the table's header names the columns; 'time' is found there)."""
    lines = readme.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| notebook |"))
    columns = [c.strip() for c in lines[header].strip("|").split("|")]
    rows = {}
    for i, line in enumerate(lines[header + 2:], start=header + 2):
        if not line.startswith("|"):
            break
        m = ROW.match(line)
        if m:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[m.group("path")] = (i, cells)
    return {"__columns__": (header, columns), **rows}


def readme_times(readme: str) -> dict[str, int]:
    """{notebook path: minutes the README gives it}."""
    rows = readme_rows(readme)
    col = rows.pop("__columns__")[1].index("time")
    return {path: parse_time(cells[col]) for path, (_, cells) in rows.items()}


def rewrite(readme: str, root: Path = ROOT) -> str:
    """The README with each row's time set from its notebook's load."""
    rows = readme_rows(readme)
    col = rows.pop("__columns__")[1].index("time")
    lines = readme.splitlines()
    for path, (i, cells) in rows.items():
        cells[col] = fmt(load(root / path)["minutes"])
        lines[i] = "| " + " | ".join(cells) + " |"
    return "\n".join(lines) + ("\n" if readme.endswith("\n") else "")


ZH_ROW = re.compile(r"^\| \[\d\d [^|]*\]\(notebooks/zh/(?P<name>\d\d_\w+\.ipynb)\) \|")


def fmt_zh(minutes: int) -> str:
    """45 -> '45 分钟', 75 -> '1 小时 15 分', 60 -> '1 小时'."""
    if minutes < 60:
        return f"{minutes} 分钟"
    h, m = divmod(minutes, 60)
    return f"{h} 小时 {m:02d} 分" if m else f"{h} 小时"


def rewrite_zh(readme_zh: str, readme: str) -> str:
    """README.zh.md with each Chinese notebook's time (its table's 4th column) set to the English
    README's time for the same notebook: one course, one estimate."""
    given = readme_times(readme)
    lines = readme_zh.splitlines()
    for i, line in enumerate(lines):
        m = ZH_ROW.match(line)
        if m:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            cells[3] = fmt_zh(given[f"notebooks/{m.group('name')}"])
            lines[i] = "| " + " | ".join(cells) + " |"
    return "\n".join(lines) + ("\n" if readme_zh.endswith("\n") else "")


def main(argv: list[str]) -> int:
    readme_path = ROOT / "README.md"
    readme = readme_path.read_text()
    if "--write" in argv:
        readme_path.write_text(rewrite(readme))
        readme = readme_path.read_text()
        zh_path = ROOT / "README.zh.md"
        zh_path.write_text(rewrite_zh(zh_path.read_text(encoding="utf-8"), readme), encoding="utf-8")
    given = readme_times(readme)
    print(f"{'notebook':<32} {'words':>6} {'code':>5} {'figs':>5} {'ex':>3} {'load':>7} {'time':>7} {'README':>7}")
    for path in sorted(ROOT.glob("notebooks/[0-9][0-9]_*.ipynb")):
        rel = str(path.relative_to(ROOT))
        ld = load(path)
        print(f"{path.name:<32} {ld['prose_words']:>6} {ld['code_cells']:>5} {ld['figures']:>5} {ld['exercises']:>3} "
              f"{ld['raw_minutes']:>7.1f} {fmt(ld['minutes']):>7} {fmt(given[rel]) if rel in given else '-':>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
