"""The Chinese edition stays in step with the English one by construction (scripts/zh_edition.py).

Its code cells and saved outputs are the English ones byte for byte, so nbval need not execute the
copies: this test proves they are the executed English notebooks. Every English markdown cell has a
translation made from its current text; a changed English cell, code or output makes this fail until
the translation is refreshed and the Chinese notebook rebuilt.
"""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("zh_edition", ROOT / "scripts" / "zh_edition.py")
zh_edition = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zh_edition)

NOTEBOOKS = zh_edition.english_notebooks()


@pytest.mark.parametrize("en_path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_chinese_notebook_is_the_english_one_translated(en_path):
    found = zh_edition.problems(en_path)
    assert not found, "\n".join(found) + "\n(python scripts/zh_edition.py template/build, then translate)"


def test_every_english_notebook_has_a_chinese_one():
    assert sorted(p.name for p in (ROOT / "notebooks" / "zh").glob("[0-9][0-9]_*.ipynb")) == \
        [p.name for p in NOTEBOOKS]


def test_the_readmes_and_glossaries_link_each_other():
    en, zh = (ROOT / "README.md").read_text(), (ROOT / "README.zh.md").read_text(encoding="utf-8")
    assert "README.zh.md" in en and "README.md" in zh
    assert "notebooks/zh/glossary.md" in zh
    zh_glossary = (ROOT / "notebooks" / "zh" / "glossary.md").read_text(encoding="utf-8")
    assert "../glossary.md" in zh_glossary and zh_edition.CJK.search(zh_glossary)
    for p in NOTEBOOKS:   # the Chinese README's course table links every Chinese notebook
        assert f"notebooks/zh/{p.name}" in zh, p.name


# --- the check itself must catch drift: a small English notebook and its edition in tmp_path ---

def _edition(tmp_path: Path) -> tuple[Path, Path]:
    en_dir, zh_dir = tmp_path / "notebooks", tmp_path / "notebooks" / "zh"
    (zh_dir / "translations").mkdir(parents=True)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# All-reduce\n\nEvery rank gets the sum."),
                nbformat.v4.new_code_cell("print(1 + 1)")]
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="2\n")]
    nb.cells[1].execution_count = 1
    en_path = en_dir / "00_demo.ipynb"
    nbformat.write(nb, en_path)
    md = nb.cells[0]
    (zh_dir / "translations" / "00_demo.md").write_text(
        f"<!-- cell {md.id} · en {zh_edition.en_hash(md.source)} -->\n# All-reduce\n\n每个 rank 都得到总和。\n",
        encoding="utf-8")
    zh_edition.build(en_path, zh_dir)
    return en_path, zh_dir


def test_an_edition_in_step_passes(tmp_path):
    en_path, zh_dir = _edition(tmp_path)
    assert zh_edition.problems(en_path, zh_dir) == []


def test_drift_is_caught(tmp_path):
    en_path, zh_dir = _edition(tmp_path)
    saved = en_path.read_bytes()

    def drifted(change) -> list[str]:
        nb = nbformat.read(en_path, as_version=4)
        change(nb)
        nbformat.write(nb, en_path)
        try:
            return zh_edition.problems(en_path, zh_dir)
        finally:
            en_path.write_bytes(saved)

    def code(nb):
        nb.cells[1].source = "print(2 + 2)"

    def output(nb):
        nb.cells[1].outputs[0].text = "4\n"

    def prose(nb):
        nb.cells[0].source += " Twice."

    def new_cell(nb):
        nb.cells.append(nbformat.v4.new_markdown_cell("A new paragraph."))

    assert any("code cell" in p for p in drifted(code))
    assert any("code cell" in p for p in drifted(output))
    assert any("changed in English" in p for p in drifted(prose))
    assert any("no translation" in p for p in drifted(new_cell))
    # an untranslated section (the template's English text) and a hand-edited copy are caught too
    tr = zh_dir / "translations" / "00_demo.md"
    tr.write_text(tr.read_text(encoding="utf-8").replace("每个 rank 都得到总和。", "Every rank gets the sum."),
                  encoding="utf-8")
    assert any("still in English" in p for p in zh_edition.problems(en_path, zh_dir))
    shutil.copy(en_path, zh_dir / en_path.name)
    tr.write_text(tr.read_text(encoding="utf-8").replace("Every rank gets the sum.", "每个 rank 都得到总和。"),
                  encoding="utf-8")
    assert any("not its translation" in p for p in zh_edition.problems(en_path, zh_dir))


def test_build_refuses_an_untranslated_notebook(tmp_path):
    en_path, zh_dir = _edition(tmp_path)
    nb = nbformat.read(en_path, as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell("Untranslated."))
    nbformat.write(nb, en_path)
    with pytest.raises(SystemExit, match="no translation"):
        zh_edition.build(en_path, zh_dir)
    assert zh_edition.template(en_path, zh_dir) == 1   # the template adds the missing section
