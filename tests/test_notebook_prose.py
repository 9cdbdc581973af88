"""Notebook prose speaks to a reader of the course, not to the people who wrote it.

Words that only make sense inside this repository's history (the text the course grew from, "the
seed"; a "colleague"; "the issue" a change was made for, or its number) tell a student nothing.
References to other projects' trackers stay welcome when they name the project
("Megatron-LM issue #443").
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))

FORBIDDEN = {
    "the seed (the text this course grew from)":
        re.compile(r"\bthe seed's\b|\bin the seed\b|\bthe seed (?:notebook|text|repo|spec|version)\b",
                   re.IGNORECASE),
    "a colleague": re.compile(r"\bcolleagues?\b", re.IGNORECASE),
    "the issue (a task of this repository)": re.compile(r"\b(?:the|this|our) issue(?:'s)?\b",
                                                        re.IGNORECASE),
    "the lead or a worktree": re.compile(r"\bthe lead\b|\bworktrees?\b", re.IGNORECASE),
}
# "issue 12", "PR #3": an issue number must say whose tracker it is in (a project's name before it)
NUMBERED = re.compile(r"(?P<before>\S+)?\s*\b(?:issues?|PR|pull requests?)\s+#?\d+", re.IGNORECASE)
PROJECT = re.compile(r"^[(\[]*(?:[A-Za-z][\w.]*(?:-[\w.]+)+|PyTorch|TransformerEngine|DeepSpeed|"
                     r"Megatron|vLLM|torchtitan|picotron)$")


def internal_words(text: str) -> list[str]:
    """The repository-internal phrases in ``text``, each with a few words around it."""
    found = []
    for what, pattern in FORBIDDEN.items():
        found += [f"{what}: ...{text[max(0, m.start() - 40):m.end() + 20]}..."
                  for m in pattern.finditer(text)]
    for m in NUMBERED.finditer(text):
        if not (m.group("before") and PROJECT.match(m.group("before"))):
            found.append(f"an issue number with no project named: ...{text[max(0, m.start() - 40):m.end()]}...")
    return found


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.stem)
def test_markdown_has_no_repository_internal_words(nb_path):
    nb = nbformat.read(nb_path, as_version=4)
    found = [f"cell {i}: {hit}" for i, c in enumerate(nb.cells) if c.cell_type == "markdown"
             for hit in internal_words(c.source.replace("\n", " "))]
    assert not found, f"{nb_path.name}: words that only make sense inside this repository:\n  " + \
        "\n  ".join(found)


@pytest.mark.parametrize("text", [
    "In the seed's notation, with W split by layers",
    "As the colleague found, the bias goes last",
    "All 4-rank layouts of the issue's list, three steps each",
    "This was fixed for issue 20 of the course.",
    "see PR #31",
])
def test_internal_words_are_found(text):
    assert internal_words(text), text


@pytest.mark.parametrize("text", [
    "a question asked as early as [Megatron-LM issue #19](https://github.com/NVIDIA/Megatron-LM/issues/19)",
    "nano-vllm issue #99 discusses it",
    "Megatron-LM issues #443 and #474",
    "(Megatron-LM issues #443 and #474)",
    "keyed by global position and the seed (`keep_mask`)",
    "does every rank issue the same all-reduces in the same order?",
    "a known issue in core 0.9.0",
])
def test_external_references_and_ordinary_words_pass(text):
    assert not internal_words(text), internal_words(text)
