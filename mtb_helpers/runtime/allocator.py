"""glibc's allocator, told to give freed memory back (Linux; elsewhere these do nothing).

A rank allocates and frees tensors on every call; by default glibc keeps large freed blocks in its
heap (its mmap threshold grows after each large free) and gives gloo's threads arenas of their own,
so a rank's memory only grows. Ranks call :func:`tune` once and :func:`trim` after each call
(~0.1 ms there); the owner calls both once, just before it forks the forkserver, so that the fork
inherits fewer pages. Not after each owner-side call: on a kernel's fragmented heap a trim costs
~6 ms, on every slider move, for a few MB.
"""
from __future__ import annotations

import ctypes
import functools
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8


@functools.lru_cache(maxsize=1)
def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def tune() -> None:
    """Two arenas, and blocks above 256 KB mapped and unmapped on their own (fixed thresholds)."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(M_ARENA_MAX, 2)
        libc.mallopt(M_MMAP_THRESHOLD, 256 * 1024)
        libc.mallopt(M_TRIM_THRESHOLD, 256 * 1024)


def trim() -> None:
    """Give the whole free pages of every arena back to the system."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
