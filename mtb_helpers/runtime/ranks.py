"""Run a function on N real gloo ranks and get every rank's result back.

    results = run(fn, *args, world_size=4, timeout=30.0, **kwargs)

Two runtimes sit behind ``run``:

* **Local pools** (notebooks, the CLI on a laptop): a warm :class:`~mtb_helpers.runtime.pool.Pool` of
  rank processes per world size, reused across calls, so a slider re-runs a 4-rank check in
  milliseconds. Pools are stopped by :func:`shutdown`, at interpreter exit, or after any failure.
* **A launched job** (``torchrun --nproc-per-node=N``): this process already *is* one rank, so
  ``fn`` runs right here inside the job's default process group and the results of all ranks are
  all-gathered. Everything built on ``run`` (the checks, the CLI) runs unchanged on a cluster.
"""
from __future__ import annotations

import atexit
import os
import random
import threading
from typing import Any, Callable

from mtb_helpers.runtime.pool import Pool
from mtb_helpers.runtime.errors import RankError, RankTimeoutError, WaitPoint

__all__ = ["run", "shutdown", "warm_up", "seed_all", "resolve_world_size", "in_launched_job",
           "RankError", "RankTimeoutError", "WaitPoint", "MAX_WORLD_SIZE"]

MAX_WORLD_SIZE = 8        # the course's figures and palettes are made for up to 8 ranks
MAX_POOLED_RANKS = 8      # warm ranks kept at once; each holds ~100 MB (Binder has 2 GB)

_pools: dict[int, Pool] = {}   # the only global mutable state of the package
_pools_lock = threading.Lock()


def in_launched_job() -> bool:
    """True when this process is a rank of a job started by torchrun (RANK and WORLD_SIZE set)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def resolve_world_size(world_size: int) -> int:
    """The world size ``run`` will really use: the launched job's under torchrun, else
    ``world_size`` after validation. Checks call this before validating shapes."""
    if in_launched_job():
        return int(os.environ["WORLD_SIZE"])
    _validate_world_size(world_size)
    return world_size


def run(fn: Callable[..., Any], *args: Any, world_size: int = 2, timeout: float = 30.0,
        **kwargs: Any) -> list:
    """Run ``fn(*args, **kwargs)`` on every rank of a gloo group; return the results by rank.

    ``fn`` may be defined in a notebook cell, a script's ``__main__``, a closure or a lambda: it
    is shipped by value. Arguments and results must be picklable (tensors are). Each rank's
    stdout/stderr is printed here afterwards, in rank order, every line tagged ``[rank r]``.

    Raises ValueError for a bad ``world_size`` or ``timeout`` before any rank starts,
    :class:`RankError` when a rank raises (``.rank``, remote traceback in the message), and
    :class:`RankTimeoutError` when ranks give no answer within ``timeout`` seconds (it names the
    waiting ranks, the collective and the line each waits at). After either error the pool is
    replaced, so the next call works.
    """
    if not callable(fn):
        raise TypeError(f"run() needs a function to run on the ranks, got {type(fn).__name__}")
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if in_launched_job():
        from mtb_helpers.runtime.launched import run_in_launched_job
        return run_in_launched_job(fn, args, kwargs, world_size)
    _validate_world_size(world_size)
    pool = _warm_pool(world_size)
    with pool.lock:
        if pool.broken:  # another thread's call broke it while we queued
            return run(fn, *args, world_size=world_size, timeout=timeout, **kwargs)
        pool.wait_ready()
        return pool.call(fn, args, kwargs, timeout)


def warm_up(*world_sizes: int, background: bool = True) -> None:
    """Start rank pools now so that the first ``run`` is fast (a notebook's import cell calls
    ``warm_up(2)``: the ranks start while the student reads). Does nothing under torchrun."""
    if in_launched_job():
        return
    for world_size in world_sizes or (2,):
        _validate_world_size(world_size)

    def start() -> None:
        for world_size in world_sizes or (2,):
            pool = _warm_pool(world_size)
            with pool.lock:
                if not pool.broken:
                    pool.wait_ready()

    if background:
        threading.Thread(target=start, name="mtb-warm-up", daemon=True).start()
    else:
        start()


def shutdown() -> None:
    """Stop every rank pool and its processes, and the forkserver. Also runs at interpreter exit."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        with pool.lock:
            pool.stop()
    _stop_forkserver()


def seed_all(seed: int) -> None:
    """Seed every random generator the course uses, identically wherever it is called: on each
    rank (so replicated tensors agree) and in the caller (so the reference matches)."""
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:
        pass


def _validate_world_size(world_size: object) -> None:
    if not isinstance(world_size, int) or isinstance(world_size, bool):
        raise ValueError(f"world_size must be an int, got {world_size!r}")
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise ValueError(f"world_size must be between 1 and {MAX_WORLD_SIZE} on one machine, "
                         f"got {world_size}")


def _warm_pool(world_size: int) -> Pool:
    with _pools_lock:
        pool = _pools.get(world_size)
        if pool is not None and not pool.broken:
            return pool
        _evict(keep_room_for=world_size)
        pool = _pools[world_size] = Pool(world_size)
        return pool


def _evict(keep_room_for: int) -> None:
    """Stop least recently created pools until ``keep_room_for`` more ranks fit the budget."""
    for size in list(_pools):
        pool = _pools[size]
        if pool.broken:
            del _pools[size]
    while _pools and sum(_pools) + keep_room_for > MAX_POOLED_RANKS:
        size = next(iter(_pools))
        pool = _pools.pop(size)
        with pool.lock:
            pool.stop()


def _stop_forkserver() -> None:
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    stop = getattr(server, "_stop", None)
    if stop is not None:
        try:
            stop()
        except (OSError, ValueError):
            pass


atexit.register(shutdown)
