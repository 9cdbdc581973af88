"""Process helpers for tests: is a pid still a live process (zombies count as dead)?"""
from __future__ import annotations

import time

import psutil


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_dead(pids: list[int], within: float = 15.0) -> bool:
    """True once none of ``pids`` is alive; False if some still are after ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def forkserver_pid() -> int | None:
    """The pid of this process's multiprocessing forkserver (None before one started)."""
    from multiprocessing import forkserver

    return forkserver._forkserver._forkserver_pid
