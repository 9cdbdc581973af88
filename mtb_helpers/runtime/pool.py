"""A warm pool of gloo rank processes for one world size, owned by this process.

Starting ranks is the slow part (each would import torch); a pool starts them once from a
forkserver that has torch preloaded, keeps them in their process group, and serves many calls.
Any failure (a rank raised, ranks stopped answering, an interrupt) kills the pool: a process
group that saw a mismatched collective cannot be trusted again, and a fresh pool costs ~0.2 s.
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
from multiprocessing import spawn as mp_spawn
from multiprocessing.connection import wait

import cloudpickle

from mtb_helpers.runtime import worker as rank_worker
from mtb_helpers.runtime.errors import (RankError, RankTimeoutError, SourceIndex, WaitPoint,
                                     format_remote_traceback, parse_wait_point, timeout_message)

START_TIMEOUT = 120.0   # cold start on a loaded 2-core machine, forkserver import included
ERROR_GRACE = 0.5       # after one rank fails, how long the others get to report before we stop them
STACK_DUMP_WAIT = 2.0   # at most, for a blocked rank to write its stack after SIGUSR1 (usually ms)
_start_lock = threading.Lock()


def start_method() -> str:
    """forkserver (torch preloaded) where the platform has it; spawn otherwise. Never fork:
    it is unsafe once the owner has used OpenMP threads, and on macOS."""
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


@contextlib.contextmanager
def _without_main_reimport():
    """Start processes without re-running the owner's ``__main__`` in them.

    multiprocessing normally re-imports the main script in every child so that functions defined
    there can be found by name; that re-runs a student's unguarded script top to bottom in every
    rank. We ship functions by value (cloudpickle), so ranks never need ``__main__``: drop it
    from the preparation data while our ranks start.
    """
    original = mp_spawn.get_preparation_data

    def without_main(name):
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    with _start_lock:
        mp_spawn.get_preparation_data = without_main
        try:
            yield
        finally:
            mp_spawn.get_preparation_data = original


def _context() -> mp.context.BaseContext:
    ctx = mp.get_context(start_method())
    if start_method() == "forkserver":
        ctx.set_forkserver_preload(["mtb_helpers.runtime.worker"])
    return ctx


class Pool:
    """``world_size`` rank processes in one gloo group, rendezvoused in a private directory."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.workdir = tempfile.mkdtemp(prefix=f"mtb-ranks{world_size}-")
        self.broken = False
        self.lock = threading.Lock()
        self._offsets = {(r, s): 0 for r in range(world_size) for s in ("stdout", "stderr")}
        ctx = _context()
        self.conns, self._lifelines, self.procs = [], [], []
        for rank in range(world_size):
            ours, theirs = ctx.Pipe(duplex=True)
            life_r, life_w = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=rank_worker.main, name=f"mtb-rank{rank}", daemon=True,
                               args=(rank, world_size, self.workdir, theirs, life_r))
            with _without_main_reimport():
                proc.start()
            theirs.close()
            life_r.close()
            self.conns.append(ours)
            self._lifelines.append(life_w)
            self.procs.append(proc)
        self._ready = False
        self._fn = None

    def wait_ready(self) -> None:
        """Block until every rank has joined the process group (first call only)."""
        if self._ready:
            return
        try:
            replies = self._collect(START_TIMEOUT, what="start")
        finally:
            self._after_collect()
        self.pids = [pid for _, pid in replies]
        self._ready = True

    def call(self, fn, args: tuple, kwargs: dict, timeout: float) -> list:
        """Run ``fn(*args, **kwargs)`` on every rank; relay output; return results by rank."""
        payload = cloudpickle.dumps((fn, args, kwargs))
        self._fn = fn  # only to find the student's source lines if something goes wrong
        try:
            for conn in self.conns:
                conn.send_bytes(pickle.dumps(("call", payload)))
            replies = self._collect(timeout, what="call")
        except KeyboardInterrupt:
            # Stopped while sending (some ranks got the call, some not): kill them all, as
            # _collect does when stopped while waiting.
            if not self.broken:
                self.kill(remove_files=False)
            raise
        finally:
            self._after_collect()
        return [value for _, value in replies]

    def _after_collect(self) -> None:
        self.relay_output()
        if self.broken:  # files were kept only so that the output of a failed call is shown
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _collect(self, timeout: float, what: str) -> list:
        """Wait for one reply per rank. Raises RankError / RankTimeoutError, killing the pool."""
        deadline = time.monotonic() + timeout
        replies: dict[int, tuple] = {}
        errors: dict[int, RankError] = {}
        first_error_at = None
        try:
            while len(replies) + len(errors) < self.world_size:
                pending = [r for r in range(self.world_size) if r not in replies and r not in errors]
                until = deadline if first_error_at is None else min(deadline,
                                                                   first_error_at + ERROR_GRACE)
                waitables = {self.conns[r]: r for r in pending}
                waitables.update({self.procs[r].sentinel: r for r in pending})
                ready = wait(list(waitables), timeout=max(0.0, until - time.monotonic()))
                if not ready:
                    break
                for obj in ready:
                    rank = waitables[obj]
                    if rank in replies or rank in errors:
                        continue
                    self._receive(rank, replies, errors)
                if errors and first_error_at is None:
                    first_error_at = time.monotonic()
        except KeyboardInterrupt:
            self.kill(remove_files=False)  # the student pressed stop: every rank goes, now
            raise
        pending = [r for r in range(self.world_size) if r not in replies and r not in errors]
        if errors:
            self.kill(remove_files=False)
            raise errors[min(errors)]
        if pending:
            waiting = self._where_waiting(pending) if what == "call" else {r: None for r in pending}
            self.kill(remove_files=False)
            message = timeout_message(timeout, sorted(replies), waiting)
            if what == "start":
                message = f"the rank pool of {self.world_size} did not start.\n" + message
            raise RankTimeoutError(message, sorted(replies), waiting)
        return [replies[r] for r in range(self.world_size)]

    def _receive(self, rank: int, replies: dict, errors: dict) -> None:
        conn = self.conns[rank]
        try:
            if not conn.poll():
                raise EOFError
            message = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            self.procs[rank].join(0.5)
            code = self.procs[rank].exitcode
            errors[rank] = RankError(rank, f"rank {rank} died (exit code {code}) without answering; "
                                     "see its output above.", "ProcessDied")
            return
        if message[0] == "error":
            _, exc_type, exc_msg, frames, raw = message
            text = format_remote_traceback(rank, exc_type, exc_msg, frames,
                                           SourceIndex(self._fn))
            errors[rank] = RankError(rank, f"rank {rank} raised {exc_type}: {exc_msg}\n\n{text}",
                                     exc_type, raw)
        else:
            replies[rank] = message

    def _where_waiting(self, ranks: list[int]) -> dict[int, WaitPoint | None]:
        """Ask blocked ranks for their Python stack (faulthandler on SIGUSR1)."""
        if not hasattr(signal, "SIGUSR1"):
            return {r: None for r in ranks}
        paths = {r: os.path.join(self.workdir, f"rank{r}.stack") for r in ranks}
        sizes = {r: _size(p) for r, p in paths.items()}
        for r in ranks:
            try:
                os.kill(self.procs[r].pid, signal.SIGUSR1)
            except OSError:
                pass
        deadline = time.monotonic() + STACK_DUMP_WAIT
        dumps: dict[int, str] = {}
        while time.monotonic() < deadline and len(dumps) < len(ranks):
            time.sleep(0.05)
            for r in ranks:
                if r not in dumps and _size(paths[r]) > sizes[r]:
                    time.sleep(0.05)  # let the dump finish
                    with open(paths[r]) as f:
                        f.seek(sizes[r])
                        dumps[r] = f.read()
        index = SourceIndex(self._fn)
        return {r: parse_wait_point(dumps[r], index) if r in dumps else None for r in ranks}

    def relay_output(self) -> None:
        """Print what each rank wrote since the last call, in rank order, tagged with its rank."""
        for stream_name, stream in (("stdout", sys.stdout), ("stderr", sys.stderr)):
            for rank in range(self.world_size):
                path = os.path.join(self.workdir, f"rank{rank}.{stream_name}")
                key = (rank, stream_name)
                try:
                    with open(path, "rb") as f:
                        f.seek(self._offsets[key])
                        data = f.read()
                except FileNotFoundError:
                    continue
                self._offsets[key] += len(data)
                for line in data.decode("utf-8", "replace").splitlines():
                    stream.write(f"[rank {rank}] {line}\n")
            stream.flush()

    def stop(self) -> None:
        """Ask ranks to leave the group and exit; kill whoever does not within a second."""
        if not self.broken:
            for conn in self.conns:
                try:
                    conn.send_bytes(pickle.dumps(("stop",)))
                except OSError:
                    pass
            deadline = time.monotonic() + 2.0
            for proc in self.procs:
                proc.join(max(0.0, deadline - time.monotonic()))
        self.kill()

    def kill(self, remove_files: bool = True) -> None:
        self.broken = True
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
        for proc in self.procs:
            proc.join(2.0)
        for conn in self.conns + self._lifelines:
            conn.close()
        if remove_files:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
