"""Prose statistics of the course's notebooks: markdown prose only (code blocks, maths, tables, headings,
indented formulas and <details> markers left out), sentences split on . ! ? outside inline code.

Usage: python scripts/prose_stats.py NOTEBOOK_DIR [MAX_AVG MAX_PCT_OVER35 [MAX_LONGEST, default 50]]
(one row per notebook; exit 1 when a notebook is over a limit). tests/test_course_text.py imports it,
so the test and this command measure the same way. It measures exactly as the project's shared tool
(prose_stats.py beside the repository) does; only the layout of the code differs.
"""
from __future__ import annotations

import glob
import json
import os
import re
import sys

INDENTED_FORMULA = re.compile(r"^\s{4,}[A-Za-zdγ]\w*\s*=|^\s{4,}[A-Z]_")
LIST_ITEM = re.compile(r"^([*-]|\d+\.)\s")
ABBREVIATIONS = re.compile(r"\b(e\.g|i\.e|et al|vs|Sec|cf|Fig|No|approx)\.")


def prose_from_md(md: str) -> list[str]:
    """The prose paragraphs (and list items, one each) of one markdown cell's source."""
    out: list[str] = []
    in_fence = in_math = False
    for line in md.splitlines():
        s = line.strip()
        if s.startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        if s.startswith("$$"):
            if s.count("$$") == 1:
                in_math = not in_math
            continue
        if in_math:
            continue
        if line.startswith("    ") and not s.startswith(("*", "-")) and (not out or out[-1] == ""):
            out.append("")   # an indented code block (preceded by a blank line)
            continue
        if line.startswith("    ") and INDENTED_FORMULA.match(line):
            out.append("")
            continue
        if s.startswith(("|", "#", "<details", "</details", "[![")):
            out.append("")   # tables, headings, the fold's markers, badges
            continue
        out.append(re.sub(r"<[^>]+>", "", s))
    paras: list[str] = []
    cur: list[str] = []
    for line in "\n".join(out).split("\n"):
        if line == "":
            if cur:
                paras.append(" ".join(cur))
                cur = []
        elif LIST_ITEM.match(line):
            if cur:
                paras.append(" ".join(cur))
            cur = [re.sub(r"^([*-]|\d+\.)\s+", "", line)]
        else:
            cur.append(line)
    if cur:
        paras.append(" ".join(cur))
    return paras


def sentences(paras: list[str]) -> list[tuple[str, int]]:
    """(sentence, word count) for every sentence of 3 words or more; inline code and maths never split one."""
    sents = []
    for p in paras:
        codes: list[str] = []

        def keep(m: re.Match) -> str:
            codes.append(m.group(0))
            return f"CODE{len(codes) - 1}X"
        q = re.sub(r"`[^`]*`", keep, p)
        q = re.sub(r"\$[^$]*\$", keep, q)
        q = ABBREVIATIONS.sub(lambda m: m.group(1) + "<DOT>", q)
        for s in re.split(r"(?<=[.!?])\**\s+", q):
            s = s.strip()
            if not s:
                continue
            words = [x for x in re.split(r"\s+", s) if re.search(r"[A-Za-z0-9]", x)]
            if len(words) >= 3:
                sents.append((s, len(words)))
    return sents


def markdown_stats(markdown_cells: list[str]) -> dict:
    """Sentence statistics of a list of markdown sources: prose words, sentences, average, share over 35."""
    paras = [p for m in markdown_cells for p in prose_from_md(m)]
    ss = sentences(paras)
    words = sum(k for _, k in ss)
    n = len(ss)
    over = sum(1 for _, k in ss if k > 35)
    return dict(prose_words=words, sentences=n, avg=round(words / n, 1), pct_over35=round(100 * over / n, 1),
                longest=max(ss, key=lambda x: x[1]))


def nb_stats(path: str) -> dict:
    """The statistics of one notebook file (markdown prose only), plus its cell and code-line counts."""
    with open(path) as f:
        nb = json.load(f)
    md = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"]
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    st = markdown_stats(md)
    return dict(md_cells=len(md), code_cells=len(code),
                code_lines=sum(len("".join(c["source"]).splitlines()) for c in code),
                md_words_raw=sum(len(m.split()) for m in md), **st)


def over_limits(st: dict, max_avg: float, max_pct: float, max_longest: float) -> bool:
    return st["avg"] > max_avg or st["pct_over35"] > max_pct or st["longest"][1] > max_longest


def main(argv: list[str]) -> int:
    d = argv[1] if len(argv) > 1 else "notebooks"
    max_avg = float(argv[2]) if len(argv) > 2 else 1e9
    max_pct = float(argv[3]) if len(argv) > 3 else 1e9
    max_longest = float(argv[4]) if len(argv) > 4 else (50 if len(argv) > 2 else 1e9)
    bad = tot_w = tot_s = tot_o = 0
    for path in sorted(glob.glob(os.path.join(d, "[0-9]*.ipynb"))):
        st = nb_stats(path)
        tot_w += st["prose_words"]
        tot_s += st["sentences"]
        tot_o += round(st["pct_over35"] * st["sentences"] / 100)
        over = over_limits(st, max_avg, max_pct, max_longest)
        bad += over
        print(f"{os.path.basename(path)[:28]:<28} words {st['prose_words']:>6}  avg {st['avg']:>5}  "
              f">35w {st['pct_over35']:>5}%  longest {st['longest'][1]}{'  OVER' if over else ''}")
    print(f"course: {tot_w} prose words, avg {tot_w / max(tot_s, 1):.1f} words/sentence, "
          f"{100 * tot_o / max(tot_s, 1):.1f}% over 35 words; notebooks over the limits: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
