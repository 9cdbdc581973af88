"""One meaning per class name (issue 34): no two classes of mtb_helpers share a name (dp/'s were
the last of them, then capstone's grid Layout and runtime's Event/Timeline). Read from the source (AST)."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mtb_helpers"


def classes(folder: Path) -> dict[str, list[str]]:
    """{class name: the files under ``folder`` defining a class of that name (nested ones too)}."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                found[node.name].append(str(path.relative_to(folder)))
    return found


def test_no_two_dp_classes_share_a_name():
    twice = {name: files for name, files in classes(PACKAGE / "dp").items() if len(files) > 1}
    assert not twice, twice


def test_no_dp_class_shares_a_name_with_another_class_of_the_package():
    """dp/'s per-step events, its step clock, its flat shards and its lane operations are not
    runtime's ``LinkEvent`` / ``LinkTimeline``, plan's ``Layout`` or pp's ``Op``."""
    dp = classes(PACKAGE / "dp")
    everywhere = classes(PACKAGE)
    shared = {name: everywhere[name] for name in dp if len(everywhere[name]) > 1}
    assert not shared, shared
    assert {"StepEvent", "StepClock", "FlatShards", "LaneOp"} <= set(dp)


def test_no_two_classes_of_the_package_share_a_name():
    twice = {name: files for name, files in classes(PACKAGE).items() if len(files) > 1}
    assert not twice, twice


def test_a_second_class_of_one_name_is_found(tmp_path):
    (tmp_path / "a.py").write_text("class Layout:\n    pass\n")
    (tmp_path / "b.py").write_text("def f():\n    class Layout:\n        pass\n")
    assert classes(tmp_path) == {"Layout": ["a.py", "b.py"]}   # a nested one too
