"""The re-anchored references a capstone check steps: kept between checks, never shared by two
checks at once (the capstone explorer prepares in a background thread while a cell may check)."""
import threading

import torch

from mtb_helpers.capstone.check import _References
from mtb_helpers.capstone.model import GPTConfig
from mtb_helpers.capstone.reference import TrainConfig

CFG, RUN = GPTConfig(), TrainConfig(steps=1)


def test_a_reference_given_back_is_reused_and_one_taken_is_nobody_elses(references_built):
    refs = _References(keep=2)
    first = refs.take(CFG, RUN, torch.float64)
    second = refs.take(CFG, RUN, torch.float64)   # the first is in use: a reference of its own
    assert second is not first and references_built == [first, second]
    refs.give(first)
    assert refs.take(CFG, RUN, torch.float64) is first and len(references_built) == 2


def test_at_most_keep_idle_references_are_kept_least_recently_given_back_dropped(references_built):
    refs = _References(keep=2)
    made = [refs.take(CFG, RUN, dtype) for dtype in (torch.float64, torch.float32, torch.float64)]
    for ref in made:
        refs.give(ref)
    # kept: the fp32 one and the fp64 one given back last; the first fp64 one was dropped
    assert refs.take(CFG, RUN, torch.float32) is made[1]
    assert refs.take(CFG, RUN, torch.float64) is made[2]
    assert refs.take(CFG, RUN, torch.float64) is not made[0] and len(references_built) == 4


def test_threads_taking_at_once_never_get_the_same_reference(references_built):
    refs = _References(keep=2)
    refs.give(refs.take(CFG, RUN, torch.float64))
    got, start = [], threading.Barrier(4)

    def take():
        start.wait()
        got.append(refs.take(CFG, RUN, torch.float64))

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(r) for r in got}) == 4 and len(references_built) == 4
