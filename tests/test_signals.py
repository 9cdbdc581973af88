"""The owner's deferred interrupt (runtime/signals.py): a Ctrl-C while ranks are being started or
killed waits until that is done, then raises; it never replaces an exception already raised."""
from __future__ import annotations

import signal

import pytest

from mtb_helpers.runtime.signals import interrupts_deferred


def test_an_interrupt_inside_the_block_is_raised_when_the_block_ends():
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts_deferred():
            signal.raise_signal(signal.SIGINT)
            reached.append("the rest of the block ran")
    assert reached == ["the rest of the block ran"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler   # put back


def test_an_interrupt_does_not_replace_the_exception_already_on_its_way_out():
    with pytest.raises(ValueError, match="first"):
        with interrupts_deferred():
            signal.raise_signal(signal.SIGINT)
            raise ValueError("first")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_interrupt_stays_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupts_deferred():
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
