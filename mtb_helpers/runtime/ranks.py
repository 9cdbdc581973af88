"""Run a function on N real gloo ranks and get every rank's result back: ``run(fn, *args,
world_size=4, timeout=30.0, **kwargs)``, on a warm :class:`~mtb_helpers.runtime.pool.Pool` of rank
processes per world size (stopped by :func:`shutdown`, at exit, when idle or over the memory
budget, or after any failure), or, under torchrun, in this rank of the job (launched.py).
"""
from __future__ import annotations

import atexit
import os
import random
import sys
import threading
import time
from typing import Any, Callable

from mtb_helpers.runtime import budget
from mtb_helpers.runtime import worker as rank_worker
from mtb_helpers.runtime.pool import Pool
from mtb_helpers.runtime.errors import RankError, RankTimeoutError, WaitPoint
from mtb_helpers.runtime.link import check_number, run_linked, validate_link
from mtb_helpers.runtime.mp_private import run_exit_finalizers, stop_forkserver
from mtb_helpers.runtime.signals import install_sigterm_cleanup
from mtb_helpers.runtime.start import preload_missing, start_forkserver

__all__ = ["run", "shutdown", "warm_up", "seed_all", "resolve_world_size", "in_launched_job",
           "RankError", "RankTimeoutError", "WaitPoint", "MAX_WORLD_SIZE"]

MAX_WORLD_SIZE = 8        # the course's figures and palettes are made for up to 8 ranks
# Warm ranks kept at once, least recently started pool stopped first (Binder has 2 GB; see
# README "Troubleshooting"): 4 + 2 ranks, or 4 + 3 when a slider moves between 3 and 4.
MAX_POOLED_RANKS = int(os.environ.get("MTB_MAX_POOLED_RANKS", "8"))
# A pool with no call for this long is stopped (the next call starts a fresh one in ~1 s), and
# the forkserver with the last pool: an open notebook nobody uses should not hold memory.
IDLE_STOP_SECONDS = float(os.environ.get("MTB_IDLE_STOP_SECONDS", "180"))
# Besides, pools not in use are stopped when the tree's memory is over budget.MEMORY_BUDGET_MIB
# (MTB_MEMORY_BUDGET_MIB, 520 by default): at a pool's start and from the idle watch.

_pools: dict[int, Pool] = {}   # the owner's warm pools, one per world size (the runtime's state)
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
        link: Any = None, time_scale: float = 1.0, **kwargs: Any) -> list:
    """Run ``fn(*args, **kwargs)`` on every rank of a gloo group; return the results by rank.

    ``fn`` may be defined in a notebook cell, a script's ``__main__``, a closure or a lambda: it
    is shipped by value. Arguments and results must be picklable (tensors are). Each rank's
    stdout/stderr is printed here afterwards, in rank order, every line tagged ``[rank r]``.

    Raises ValueError for a bad ``world_size`` or ``timeout`` before any rank starts,
    :class:`RankError` when a rank raises (``.rank``, remote traceback in the message), and
    :class:`RankTimeoutError` when ranks give no answer within ``timeout`` seconds (it names the
    waiting ranks, the collective and the line each waits at). After either error the pool is
    replaced, so the next call works.

    ``link=Link(alpha, bandwidth)`` (``mtb_helpers.cost``) emulates that link: every collective
    and message issued through ``torch.distributed`` also takes its modelled time (x
    ``time_scale``), results unchanged; the list returned then has ``.timeline`` (see
    :mod:`mtb_helpers.runtime.link`). A link this machine cannot honour at ``time_scale`` is
    refused with a ValueError before ``fn`` starts.
    """
    if not callable(fn):
        raise TypeError(f"run() needs a function to run on the ranks, got {type(fn).__name__}")
    check_number(timeout, "timeout must be a positive, finite number of seconds")
    if link is not None:
        validate_link(link, time_scale)
        if in_launched_job():
            raise ValueError("link= emulates a link on this machine's rank pool; under torchrun "
                             "the ranks' own network is the link")
    if in_launched_job():
        from mtb_helpers.runtime.launched import run_in_launched_job
        return run_in_launched_job(fn, args, kwargs, world_size)
    if rank_worker.IN_RANK:
        raise RuntimeError("run() was called inside a rank: ranks cannot start ranks. This code "
                           "already runs on every rank; call the collectives directly "
                           "(torch.distributed.get_rank() says which rank this is).")
    _validate_world_size(world_size)
    install_sigterm_cleanup(_kill_everything)
    if preload_missing():
        _restart_for_preload()
    while True:
        pool = _warm_pool(world_size)
        with pool.lock:
            if pool.broken:  # another thread's call broke it while we queued
                continue
            pool.wait_ready()
            dead = pool.dead_ranks()
            if dead:  # died since the last call (the out-of-memory killer): start afresh
                pool.kill()
                causes = "; ".join(f"rank {r} died ({cause})" for r, cause in dead.items())
                print(f"[mtb] the {world_size}-rank pool had lost a rank since the last call "
                      f"({causes}); starting a fresh pool.", file=sys.stderr, flush=True)
                continue
            if link is not None:
                return run_linked(pool, fn, args, kwargs, timeout, link, time_scale)
            return pool.call(fn, args, kwargs, timeout)


def warm_up(*world_sizes: int, background: bool = True) -> None:
    """Start rank pools now so that the first ``run`` is fast (a notebook's import cell calls
    ``warm_up(2)``: the ranks start while the student reads). Does nothing under torchrun."""
    if in_launched_job() or rank_worker.IN_RANK:
        return
    world_sizes = world_sizes or (2,)
    for world_size in world_sizes:
        _validate_world_size(world_size)
    install_sigterm_cleanup(_kill_everything)

    def start() -> None:
        for world_size in world_sizes:
            pool = _warm_pool(world_size)
            with pool.lock:
                if not pool.broken:
                    pool.wait_ready()

    if background:
        start_forkserver()  # a fork of this process: from the calling thread, never a background one
        threading.Thread(target=start, name="mtb-warm-up", daemon=True).start()
    else:
        start()


def shutdown() -> None:
    """Stop every rank pool and its processes, and the forkserver. Also runs at interpreter exit."""
    budget.forget()
    release()


def release(*world_sizes: int) -> None:
    """Stop the pools of these world sizes now (all pools if none given), e.g. when a notebook
    has finished with 4 ranks and memory is tight. The next ``run`` at a size starts it again."""
    with _pools_lock:
        pools = [_pools.pop(s) for s in list(_pools) if not world_sizes or s in world_sizes]
    _stop_pools(pools)


def _restart_for_preload() -> None:
    """A course module loaded since the forkserver started has lazy imports on its ranks
    (``HEAVY_RANK_IMPORTS``, start.py): unless a call is in flight (then at the next run), stop the
    pools and the forkserver, so the next pool starts from one that preloaded them (~1 s once,
    against every rank importing them itself: torch._dynamo ~0.8 s and ~35 MB a rank)."""
    with _pools_lock:
        busy = any(pool.lock.locked() for pool in _pools.values())
    if not busy:
        release()


def _kill_everything() -> None:
    """SIGTERM (a Jupyter shutdown or restart): no goodbyes, kill every rank, remove every
    work dir, stop the forkserver and remove multiprocessing's ``pymp-*`` dir (an exit finalizer
    that a signal death never runs), in well under 1 s."""
    for pool in list(_pools.values()):
        pool.kill()
    _pools.clear()
    stop_forkserver()
    run_exit_finalizers()


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
        # ``starting``: the pool about to start counts; pool_over_budget takes one out of _pools
        while (over := budget.pool_over_budget(_pools, starting=world_size)) is not None:
            over.stop()
        pool = _pools[world_size] = Pool(world_size)
        _start_idle_watch()
        return pool


_idle_watch: threading.Thread | None = None


def _start_idle_watch() -> None:
    global _idle_watch
    if _idle_watch is None:
        _idle_watch = threading.Thread(target=_stop_idle_pools, name="mtb-idle-watch", daemon=True)
        _idle_watch.start()


def _stop_idle_pools() -> None:
    """Every few seconds: stop pools idle for IDLE_STOP_SECONDS; the forkserver with the last.
    Where the memory budget applies, while a call runs or ran in the last TRIM_SECONDS: give
    the owner's freed heap pages back, and (a call since the last look, two or more pools warm)
    keep to the budget."""
    checked = time.monotonic()
    while True:
        time.sleep(max(0.05, min(IDLE_STOP_SECONDS / 4, 10.0, budget.MEMORY_CHECK_SECONDS)))
        now = time.monotonic()
        with _pools_lock:   # memory grows during a long call too (a 20-step training check)
            calling = any(p.lock.locked() or p.last_used > checked for p in _pools.values())
            # the cell goes on after its calls (a check compares, draws): trim a while longer
            recent = any(p.lock.locked() or now - p.last_used < budget.TRIM_SECONDS
                         for p in _pools.values())
            several = len(_pools) > 1
        if recent and budget.applies() and now - checked >= budget.MEMORY_CHECK_SECONDS:
            checked = now
            budget.release_owner_memory()   # never on a call's path
            if calling and several:
                with _pools_lock:   # chosen under the lock, stopped without it: a call may start
                    over = budget.pool_over_budget(_pools)
                if over is not None:
                    over.stop()
        now = time.monotonic()
        with _pools_lock:
            idle = [s for s, p in _pools.items()
                    if now - p.last_used > IDLE_STOP_SECONDS and not p.lock.locked()]
            pools = [_pools.pop(s) for s in idle]
        if pools:
            _stop_pools(pools)


def _evict(keep_room_for: int) -> None:
    """Stop least recently created pools until ``keep_room_for`` more ranks fit the budget."""
    for size in [s for s, p in _pools.items() if p.broken]:
        del _pools[size]
    while _pools and sum(_pools) + keep_room_for > MAX_POOLED_RANKS:
        size = next(iter(_pools))
        _pools.pop(size).stop()


def _stop_pools(pools: list[Pool]) -> None:
    """Stop these pools (taken out of ``_pools``), then the forkserver if no pool is left."""
    for pool in pools:
        pool.stop()
    with _pools_lock:
        if not _pools:
            stop_forkserver()


atexit.register(shutdown)
