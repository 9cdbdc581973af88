import pytest

from mtb_helpers import shutdown


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
