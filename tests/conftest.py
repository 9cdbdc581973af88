import pytest

from mtb_helpers import shutdown


@pytest.fixture(scope="session", autouse=True)
def _stop_rank_pools_at_the_end():
    yield
    shutdown()
