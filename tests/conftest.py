import ast
from pathlib import Path

import pytest

from mtb_helpers import shutdown

# Modules whose tests start no rank and no process: pure functions (schedules, cost and memory
# models), the package's layering and lint, the notebooks' saved outputs. Every other test starts
# ranks (or a subprocess) and is marked slow, except one that asks for ``no_ranks`` (bad input
# refused before any rank starts).
NO_RANK_MODULES = {"test_layering", "test_lint", "test_course_text", "test_cost_model", "test_plan_memory",
                   "test_plan_time", "test_pp", "test_pp_bubble_limits", "test_notebook_hygiene",
                   "test_corrections", "test_mp_private"}
_PROCESS_NAMES = {"run", "subprocess", "Popen"}   # a test that names these starts ranks or a process
_starters: dict[str, set[str]] = {}


def _starts_processes(path: Path, name: str) -> bool:
    """Does test ``name`` of a no-rank module still start ranks or a process (read from its source)?"""
    if str(path) not in _starters:
        found = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef):
                names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                names |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
                if names & _PROCESS_NAMES:
                    found.add(node.name)
        _starters[str(path)] = found
    return name in _starters[str(path)]


def pytest_collection_modifyitems(config, items):
    """``notebook`` (nbval), ``browser`` and ``slow`` marks, so ``pytest -m "not slow"`` is the
    quick loop (about a minute) and ``pytest -m notebook`` runs the notebooks alone."""
    for item in items:
        path = Path(str(item.fspath))
        if path.suffix == ".ipynb":
            item.add_marker(pytest.mark.notebook)
            item.add_marker(pytest.mark.slow)
        elif path.stem == "test_browser":
            item.add_marker(pytest.mark.browser)
            item.add_marker(pytest.mark.slow)
        elif path.stem in NO_RANK_MODULES:
            if _starts_processes(path, getattr(item, "originalname", item.name)):
                item.add_marker(pytest.mark.slow)
        elif "no_ranks" not in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session", autouse=True)
def _stop_rank_pools_at_the_end():
    yield
    shutdown()


@pytest.fixture
def no_ranks(monkeypatch):
    """Bad input must be refused before any rank starts: every package module's ``run`` (however
    it was imported) fails the test if it is called."""
    import importlib
    import pkgutil
    import sys

    import mtb_helpers
    from mtb_helpers.runtime import ranks

    # a command may import its check only when it runs: import every module now, so all are caught
    for info in pkgutil.walk_packages(mtb_helpers.__path__, "mtb_helpers."):
        if not info.name.endswith("__main__"):   # importing a __main__ would run the command
            importlib.import_module(info.name)

    def refuse(*args, **kwargs):
        raise AssertionError("a rank was started")

    real = ranks.run   # read once: patching ranks itself must not hide the others
    for name, module in list(sys.modules.items()):
        if name.startswith("mtb_helpers") and getattr(module, "run", None) is real:
            monkeypatch.setattr(module, "run", refuse)
    return refuse


@pytest.fixture
def references_built(monkeypatch) -> list:
    """Every one-process reference ``capstone/check.py`` builds from now on, in order (its
    ``Reference``, counted): how tests see that a kept reference is reused, not rebuilt."""
    from mtb_helpers.capstone import check

    made, real = [], check.Reference

    def counted(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(check, "Reference", counted)
    return made
