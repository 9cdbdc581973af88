"""The package map of docs/design.md against the tree, folder by folder and both ways: every file
of ``mtb_helpers`` has its line (by its full path: a file of the same name in another folder does
not count), and every line has its file. The check is shown to fail on a deliberately missing and
a deliberately extra entry, and ``--write`` to touch nothing outside the map."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.load_scripts import ROOT, load_script

package_map = load_script("scripts/package_map.py")
DESIGN = ROOT / "docs" / "design.md"


def without_line(text: str, entry: str, folder: str) -> str:
    """``text`` with the map line of ``entry`` under ``folder/`` removed (only that one)."""
    start, end = package_map.section(text)
    lines, current, out = text[start:end].splitlines(keepends=True), "", []
    for line in lines:
        if line.strip().endswith("/") and " " not in line.strip():
            current = line.strip()
        if current == f"{folder}/" and line.startswith("    ") and line.split()[0] == entry:
            continue
        out.append(line)
    assert len(out) == len(lines) - 1, f"{folder}/{entry} is not in the map"
    return text[:start] + "".join(out) + text[end:]


def with_line(text: str, entry: str, folder: str) -> str:
    """``text`` with a map line for ``entry`` added under ``folder/``."""
    heading = f"\n  {folder}/\n"
    assert heading in text
    return text.replace(heading, f"{heading}    {entry:<18} A module that is not there\n", 1)


def test_the_design_documents_map_matches_the_tree_both_ways():
    diffs = package_map.differences(DESIGN.read_text())
    assert not diffs, ("docs/design.md's package map and the tree differ (run "
                       "`python scripts/package_map.py --write`):\n" + package_map.report(diffs))


def test_a_missing_entry_fails_by_full_path_though_its_name_is_listed_elsewhere():
    text = without_line(DESIGN.read_text(), "budget.py", "runtime")
    assert "plan/" in text and "    budget.py" in text   # plan/budget.py is still listed
    assert package_map.differences(text) == {"runtime": (["runtime/budget.py"], [])}
    assert "runtime/: not in the map: runtime/budget.py" in package_map.report(
        package_map.differences(text))


def test_an_extra_entry_with_no_file_fails():
    text = with_line(DESIGN.read_text(), "ghost.py", "runtime")
    assert package_map.differences(text) == {"runtime": ([], ["runtime/ghost.py"])}
    top = DESIGN.read_text().replace("\n  check.py ", "\n  ghost.py           A top-level module that is not there\n"
                                        "  check.py ", 1)
    assert package_map.differences(top) == {"": ([], ["ghost.py"])}


@pytest.fixture
def copy(tmp_path):
    """A copy of the package's Python files and of docs/design.md."""
    package = tmp_path / "mtb_helpers"
    for path in package_map.files():
        target = package / path.relative_to(package_map.PACKAGE)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    design = tmp_path / "design.md"
    shutil.copyfile(DESIGN, design)
    return package, design


def test_a_new_or_removed_file_in_the_tree_fails_then_write_fixes_only_the_map(copy):
    package, design = copy
    assert package_map.differences(design.read_text(), package) == {}
    (package / "runtime" / "newcomer.py").write_text('"""A module added without its line."""\n')
    (package / "cp" / "pytorch.py").unlink()
    assert package_map.differences(design.read_text(), package) == {
        "cp": ([], ["cp/pytorch.py"]), "runtime": (["runtime/newcomer.py"], [])}
    before = design.read_text()
    package_map.write(design, package)
    after = design.read_text()
    assert package_map.differences(after, package) == {}
    assert "    newcomer.py        A module added without its line" in after
    start, end = package_map.section(before)
    new_start, new_end = package_map.section(after)
    assert before[:start] == after[:new_start] and before[end:] == after[new_end:]


def test_the_check_command_exits_1_naming_the_difference(tmp_path, monkeypatch):
    done = subprocess.run([sys.executable, "scripts/package_map.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout
    monkeypatch.setattr(package_map, "DESIGN", tmp_path / "design.md")
    (tmp_path / "design.md").write_text("no map here\n")
    with pytest.raises(ValueError, match="markers are missing"):
        package_map.write(tmp_path / "design.md")
