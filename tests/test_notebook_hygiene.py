"""The saved notebooks as students first see them (GitHub, nbviewer, Colab, before running anything).

Every ``notebooks/*.ipynb`` is checked: saved executed top to bottom, no errors, no machine paths,
the Colab install cell first (with the address from pyproject), widget cells ignored by nbval,
at least one compared summary cell, world sizes that fit Binder, links that lead somewhere. The
README's course index and the Binder environment are checked against the same files.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from tests.load_scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
ABSOLUTE_PATH = re.compile(r"(?<![\w.~-])/(work|tmp|root|home)/")
# markdown [text](target) and <a href="target">; the target may carry an #anchor
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?[^)]*\)|href=[\"']([^\"']+)[\"']")
MAX_NOTEBOOK_WORLD_SIZE = 4  # Binder: 1 CPU, 2 GB


SYNC = load_script("scripts/sync_colab_cell.py")
REPO_URL = SYNC.repository_url(ROOT / "pyproject.toml")


def _read(path: Path):
    return nbformat.read(path, as_version=4)


def _code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def _first_line(cell) -> str:
    return cell.source.lstrip().splitlines()[0].strip() if cell.source.strip() else ""


def _output_texts(cell):
    """(where, text) for every textual part of a cell's outputs; images are skipped (base64
    contains '/' and would match paths by chance)."""
    for i, out in enumerate(cell.get("outputs", [])):
        if out.output_type == "stream":
            yield f"output {i} ({out.name})", out.text
        elif out.output_type == "error":
            yield f"output {i} (error)", "\n".join(out.traceback)
        for mime, value in out.get("data", {}).items():
            if mime.startswith("image/") and mime != "image/svg+xml":
                continue
            yield f"output {i} ({mime})", value if isinstance(value, str) else json.dumps(value)


def _where(nb, cell) -> str:
    index = nb.cells.index(cell)
    return f"cell {index} [{cell.get('execution_count')}] starting {_first_line(cell)!r}"


def test_the_course_has_notebooks():
    assert NOTEBOOKS, f"no notebooks in {NOTEBOOK_DIR}: nothing for nbval or the browser test"


@pytest.fixture(params=NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def nb_path(request) -> Path:
    return request.param


def test_saved_executed_top_to_bottom(nb_path):
    nb = _read(nb_path)
    cells = _code_cells(nb)
    unexecuted = [_where(nb, c) for c in cells if c.execution_count is None]
    assert not unexecuted, (f"{nb_path.name}: code cells never executed (empty cells count: "
                            f"delete them) - run scripts/execute_notebook.py: {unexecuted}")
    counts = [c.execution_count for c in cells]
    assert counts == list(range(1, len(cells) + 1)), (
        f"{nb_path.name}: execution counts {counts} are not 1..{len(cells)}; save it with "
        f"scripts/execute_notebook.py")
    assert not any("execution" in c.metadata for c in cells), \
        f"{nb_path.name}: per-cell execution timestamps saved (stray metadata)"


def test_no_error_outputs(nb_path):
    nb = _read(nb_path)
    errors = [f"{_where(nb, c)}: {o.ename}: {o.evalue}"
              for c in _code_cells(nb) for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{nb_path.name} was saved with errors: {errors}"


def test_no_absolute_paths_in_outputs(nb_path):
    nb = _read(nb_path)
    found = [f"{_where(nb, c)} {where}: ...{text[max(m.start() - 40, 0):m.end() + 40]!r}..."
             for c in _code_cells(nb) for where, text in _output_texts(c)
             for m in [ABSOLUTE_PATH.search(text)] if m]
    assert not found, f"{nb_path.name}: outputs show paths of the machine that ran it: {found}"


def test_first_code_cell_installs_the_package_from_the_repository(nb_path):
    cells = _code_cells(_read(nb_path))
    assert cells, f"{nb_path.name} has no code cell"
    assert cells[0].source == SYNC.colab_cell_source(REPO_URL), (
        f"{nb_path.name}: the first code cell is not the Colab install cell for {REPO_URL}; "
        f"run: python scripts/sync_colab_cell.py\n--- found ---\n{cells[0].source}")


def test_widget_cells_are_ignored_by_nbval(nb_path):
    nb = _read(nb_path)
    unmarked = [_where(nb, c) for c in _code_cells(nb)
                if any(WIDGET_MIME in o.get("data", {}) for o in c.outputs)
                and _first_line(c) != "# NBVAL_IGNORE_OUTPUT"]
    assert not unmarked, (f"{nb_path.name}: cells that display widgets must start with "
                          f"'# NBVAL_IGNORE_OUTPUT' (widget ids differ every run): {unmarked}")


def test_has_a_compared_summary_cell(nb_path):
    nb = _read(nb_path)
    checked = [c for c in _code_cells(nb) if _first_line(c) == "# NBVAL_CHECK_OUTPUT"]
    assert checked, f"{nb_path.name}: no '# NBVAL_CHECK_OUTPUT' cell, so nbval compares nothing"
    empty = [_where(nb, c) for c in checked if not c.outputs]
    assert not empty, f"{nb_path.name}: NBVAL_CHECK_OUTPUT cells with no output to compare: {empty}"


def test_world_sizes_fit_binder(nb_path):
    nb = _read(nb_path)
    pattern = re.compile(r"(?:world_size\s*=\s*|warm_up\(\s*)(\d+)")
    too_big = [f"{_where(nb, c)}: {m.group(0)}" for c in _code_cells(nb)
               for m in pattern.finditer(c.source) if int(m.group(1)) > MAX_NOTEBOOK_WORLD_SIZE]
    assert not too_big, (f"{nb_path.name}: world sizes above {MAX_NOTEBOOK_WORLD_SIZE} do not fit "
                         f"Binder (1 CPU, 2 GB): {too_big}")


def _local_targets(text: str):
    for m in LINK.finditer(text):
        target = (m.group(1) or m.group(2)).split("#")[0]
        if target and not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # skip http:, mailto:, ...
            yield target


def test_links_between_notebooks_exist(nb_path):
    nb = _read(nb_path)
    broken = [f"{_where(nb, c)}: {t}" for c in nb.cells if c.cell_type == "markdown"
              for t in _local_targets(c.source) if not (nb_path.parent / t).exists()]
    assert not broken, f"{nb_path.name}: links to files that do not exist: {broken}"


def test_links_with_a_dead_target_are_found(tmp_path):
    """The link check itself: a markdown link and an html link to missing files are both seen."""
    text = "see [next](03_nope.ipynb#top) and <a href='figs/x.png'>x</a> and [web](https://a.b)"
    assert list(_local_targets(text)) == ["03_nope.ipynb", "figs/x.png"]


# ---------------------------------------------------------------- the sync script


def test_sync_script_rewrites_only_the_install_cell(tmp_path):
    source = NOTEBOOKS[0] if NOTEBOOKS else pytest.fail("no notebook to sync")
    nb_copy = tmp_path / source.name
    shutil.copy(source, nb_copy)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\n[project.urls]\n'
                         'Repository = "https://github.com/someone/fork.git"\n')
    readme = tmp_path / "README.md"
    shutil.copy(ROOT / "README.md", readme)
    cmd = [sys.executable, str(ROOT / "scripts" / "sync_colab_cell.py"),
           "--pyproject", str(pyproject), "--readme", str(readme), str(nb_copy)]
    check = subprocess.run(cmd + ["--check"], capture_output=True, text=True)
    assert check.returncode == 1, check.stdout + check.stderr
    assert nb_copy.read_bytes() == source.read_bytes(), "--check must not write"
    assert readme.read_text() == _readme(), "--check must not write"
    subprocess.run(cmd, check=True, capture_output=True)
    owner_repo = REPO_URL.removeprefix("https://github.com/")
    synced = readme.read_text()
    for link in ("colab.research.google.com/github/", "mybinder.org/v2/gh/"):
        assert f"{link}{owner_repo}/" not in synced and f"{link}someone/fork/" in synced, link
    before, after = _read(source), _read(nb_copy)
    assert _code_cells(after)[0].source == SYNC.colab_cell_source("https://github.com/someone/fork")
    assert 'git+https://github.com/someone/fork"' in _code_cells(after)[0].source
    first = next(i for i, c in enumerate(before.cells) if c.cell_type == "code")
    for i, (b, a) in enumerate(zip(before.cells, after.cells, strict=True)):
        if i != first:
            assert a == b, f"cell {i} changed"
        else:
            assert (a.outputs, a.execution_count, a.metadata) == \
                   (b.outputs, b.execution_count, b.metadata)
    assert after.metadata == before.metadata
    again = subprocess.run(cmd + ["--check"], capture_output=True, text=True)
    assert again.returncode == 0, again.stdout


def test_sync_script_refuses_a_notebook_without_the_install_cell(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import torch")])
    path = tmp_path / "x.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(ValueError, match="not the Colab install cell"):
        SYNC.sync(path, REPO_URL)


# ---------------------------------------------------------------- README and Binder


def _readme() -> str:
    return (ROOT / "README.md").read_text()


def test_readme_indexes_every_notebook_with_a_colab_link():
    readme = _readme()
    owner_repo = REPO_URL.removeprefix("https://github.com/")
    missing = [p.name for p in NOTEBOOKS
               if f"https://colab.research.google.com/github/{owner_repo}/blob/main/notebooks/"
                  f"{p.name}" not in readme]
    assert not missing, f"README course index lacks an 'Open in Colab' link for {missing}"
    unlisted = [p.name for p in NOTEBOOKS if f"(notebooks/{p.name})" not in readme]
    assert not unlisted, f"README course index does not link {unlisted}"


def test_readme_local_links_exist():
    broken = [t for t in _local_targets(_readme()) if not (ROOT / t).exists()]
    assert not broken, f"README links to files that do not exist: {broken}"


def test_readme_binder_badge_opens_the_course_in_jupyterlab():
    owner_repo = REPO_URL.removeprefix("https://github.com/")
    m = re.search(r"https://mybinder\.org/v2/gh/([^/]+/[^/]+)/(\w+)\?urlpath=lab/tree/([^)\s]+)",
                  _readme())
    assert m, "README has no Binder badge link with urlpath=lab/tree/..."
    assert m.group(1) == owner_repo
    assert (ROOT / m.group(3)).exists(), f"Binder opens {m.group(3)}, which does not exist"


def _env(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_environment_is_cpu_only_and_matches_binder():
    env = _env(ROOT / "environment.yml")
    assert env["channels"] == ["conda-forge"]
    deps = [d for d in env["dependencies"] if isinstance(d, str)]
    names = {re.split(r"[=<>! ]", d)[0] for d in deps}
    assert "python=3.11" in deps
    assert "pytorch-cpu" in names and "pytorch" not in names, "only the CPU build fits Binder"
    assert {"jupyterlab", "ipywidgets", "matplotlib", "nbval", "cloudpickle"} <= names
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert pip == ["-e ."]
    # binder/ must hold its own copy (repo2docker ignores root files when binder/ exists), and
    # conda runs pip from the environment file's folder, so there the package is one level up.
    binder = _env(ROOT / "binder" / "environment.yml")
    assert binder["dependencies"][:-1] == env["dependencies"][:-1]
    assert binder["dependencies"][-1] == {"pip": ["-e .."]}
    assert binder["channels"] == env["channels"]


def test_binder_start_sets_one_thread_and_execs_the_command(tmp_path):
    start = ROOT / "binder" / "start"
    assert start.stat().st_mode & 0o111, "binder/start must be executable"
    out = subprocess.run([str(start), sys.executable, "-c",
                          "import os; print(os.environ['OMP_NUM_THREADS'], "
                          "os.environ['MKL_NUM_THREADS'])"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "1"]


def test_each_check_fails_on_a_notebook_that_breaks_it(tmp_path):
    """The checks above, run on notebooks made to break exactly one rule each."""
    new_code, new_md = nbformat.v4.new_code_cell, nbformat.v4.new_markdown_cell
    out = nbformat.v4.new_output

    def saved(cells, name):
        for i, cell in enumerate([c for c in cells if c.cell_type == "code"], start=1):
            if cell.execution_count is None and "unrun" not in cell.source:
                cell.execution_count = i
        path = tmp_path / f"{name}.ipynb"
        nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
        return path

    def good():
        return [new_md("# t"), new_code(SYNC.colab_cell_source(REPO_URL)),
                new_code("# NBVAL_CHECK_OUTPUT\nprint(1)",
                         outputs=[out("stream", name="stdout", text="1\n")])]

    fine = saved(good(), "fine")
    checks = [test_saved_executed_top_to_bottom, test_no_error_outputs,
              test_no_absolute_paths_in_outputs,
              test_first_code_cell_installs_the_package_from_the_repository,
              test_widget_cells_are_ignored_by_nbval, test_has_a_compared_summary_cell,
              test_world_sizes_fit_binder, test_links_between_notebooks_exist]
    for check in checks:
        check(fine)  # the control: a notebook that keeps every rule passes every check

    widget = out("display_data", data={WIDGET_MIME: {"model_id": "x"}, "text/plain": "w"})
    breakers = {
        test_saved_executed_top_to_bottom: good() + [new_code("x = 1  # unrun")],
        test_no_error_outputs: good() + [new_code("1/0", outputs=[out(
            "error", ename="ZeroDivisionError", evalue="division by zero", traceback=[])])],
        test_no_absolute_paths_in_outputs: good() + [new_code("print(p)", outputs=[out(
            "stream", name="stdout", text="saved to /home/student/x.png\n")])],
        test_first_code_cell_installs_the_package_from_the_repository:
            [new_code("import torch")] + good()[1:],
        test_widget_cells_are_ignored_by_nbval: good() + [new_code("w", outputs=[widget])],
        test_has_a_compared_summary_cell: good()[:2] + [new_code("print(1)")],
        test_world_sizes_fit_binder: good() + [new_code("run(f, world_size=8)")],
        test_links_between_notebooks_exist: good() + [new_md("[next](07_missing.ipynb)")],
    }
    for check, cells in breakers.items():
        with pytest.raises(AssertionError):
            check(saved(cells, check.__name__))


SHOW_CODE = ("def show_code(obj):\n"
             "    # print the package code a cell is about to run, so nothing happens off-screen\n"
             "    print(inspect.getsource(obj))")


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_one_source_printing_helper(nb_path):
    """A notebook that prints package source does it with show_code(obj), defined the same way
    in every notebook: no second name (show) or second body for the same job."""
    code = "\n".join(c.source for c in _read(nb_path).cells if c.cell_type == "code")
    printers = re.findall(r"def (\w+)\((\w+)\):\n(?:    #[^\n]*\n)?    print\(inspect\.getsource\(\2\)\)",
                          code)
    assert all(name == "show_code" for name, _ in printers), \
        f"{nb_path.name} prints source with {sorted({n for n, _ in printers})}, not show_code"
    if printers:
        assert SHOW_CODE in code, f"{nb_path.name}: show_code differs from the course's one definition"


def test_one_source_printing_helper_catches_a_second_name_and_a_second_body(tmp_path):
    for source in (SHOW_CODE.replace("show_code", "show"),
                   SHOW_CODE.replace("(obj)", "(fn)").replace("getsource(obj)", "getsource(fn)"),
                   SHOW_CODE.replace("so nothing happens off-screen", "so you read it")):
        path = tmp_path / "nb.ipynb"
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)]), path)
        with pytest.raises(AssertionError):
            test_one_source_printing_helper(path)
    path = tmp_path / "ok.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(SHOW_CODE)]), path)
    test_one_source_printing_helper(path)
