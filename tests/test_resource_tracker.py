"""multiprocessing's resource tracker, started for the ranks' forkserver: a small interpreter
without site and isolated (it runs the standard library only), and still doing its job."""
import sys

from mtb_helpers import run
from mtb_helpers.runtime import start
from mtb_helpers.runtime.start import TRACKER_FLAGS


def test_the_tracker_starts_without_site_and_other_helpers_as_asked(monkeypatch):
    started = []

    class FakePopen:
        def __init__(self, args, **kwargs):
            started.append(list(args))
            self.pid = 12345

    monkeypatch.setattr(start.subprocess, "Popen", FakePopen)
    monkeypatch.setenv("MTB_FORK_FORKSERVER", "0")   # the forkserver too as a new interpreter
    tracker = [sys.executable, "-B", "-c", "from multiprocessing.resource_tracker import main;main(5)"]
    server = [sys.executable, "-B", "-c", "from multiprocessing.forkserver import main; main(1)"]
    assert start._spawn_in_own_session(sys.executable, tracker, [5]) == 12345
    start._spawn_in_own_session(sys.executable, server, [1])
    assert started == [[sys.executable, *TRACKER_FLAGS, *tracker[1:]], server]


def _lock_on_a_rank() -> bool:
    import multiprocessing as mp

    lock = mp.get_context("forkserver").Lock()   # registers a named semaphore with the tracker
    with lock:
        pass
    del lock                                     # and unregisters it
    return True


def test_ranks_still_register_with_the_tracker():
    assert run(_lock_on_a_rank, world_size=2) == [True, True]
    assert run(_lock_on_a_rank, world_size=2) == [True, True]   # it is still there to talk to
