"""A warm pool of gloo rank processes for one world size, owned by this process.

Starting ranks is the slow part (each would import torch); a pool starts them once from a
forkserver that has torch preloaded, keeps them in their process group, and serves many calls.
Any failure (a rank raised, ranks stopped answering, an interrupt) kills the pool: a process
group that saw a mismatched collective cannot be trusted again, and a fresh pool costs ~0.2 s.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
from multiprocessing.connection import wait

import cloudpickle

from mtb_helpers.runtime import worker as rank_worker
from mtb_helpers.runtime.errors import (RankError, RankTimeoutError, SourceIndex, ask_where_waiting,
                                        blame, death_cause, format_remote_traceback,
                                        timeout_message)
from mtb_helpers.runtime.signals import interrupts_deferred
from mtb_helpers.runtime.start import context, without_main_reimport

START_TIMEOUT = 120.0   # cold start on a loaded 2-core machine, forkserver import included
ERROR_GRACE = 0.5       # after one rank fails, how long the others get to report before we stop them
MAX_WAIT_SLICE = 3600.0 # one wait() at most this long: select() overflows beyond ~2.1e6 s


class Pool:
    """``world_size`` rank processes in one gloo group, rendezvoused in a private directory."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.broken = False
        self.lock = threading.Lock()
        self.call_id = 0          # every call and its replies carry an id; a reply is checked
        self.last_used = time.monotonic()
        self.orphaned = False     # the forkserver that started the ranks died; ranks may be alive
        self.link_floor = None    # what gloo needs here, for emulated links (runtime/link.py)
        self._offsets = {(r, s): 0 for r in range(world_size) for s in ("stdout", "stderr")}
        self._ready = False
        self._fn = None
        self.conns, self._lifelines, self.procs = [], [], []
        self.workdir = tempfile.mkdtemp(prefix=f"mtb-ranks{world_size}-")
        try:
            self._start(context())
        except BaseException:  # an interrupt or error half-way: leave no rank and no dir behind
            self.kill()
            raise

    def _start(self, ctx) -> None:
        for rank in range(self.world_size):
            ours, theirs = ctx.Pipe(duplex=True)
            life_r, life_w = ctx.Pipe(duplex=False)
            self.conns.append(ours)
            self._lifelines.append(life_w)
            proc = ctx.Process(target=rank_worker.main, name=f"mtb-rank{rank}", daemon=True,
                               args=(rank, self.world_size, self.workdir, theirs, life_r))
            self.procs.append(proc)  # before start: kill() must find it if start is interrupted
            try:
                # Ctrl-C waits until start() returns: interrupted half-way, a forked rank had no
                # pid here (so kill() missed it and it printed its traceback once its work dir
                # was gone), or the forkserver's fork swallowed it in an at-fork hook
                with interrupts_deferred(), without_main_reimport():
                    proc.start()
            finally:
                theirs.close()
                life_r.close()

    def wait_ready(self) -> None:
        """Block until every rank has joined the process group (first call only)."""
        if self._ready:
            return
        with self._in_flight():
            replies = self._collect(START_TIMEOUT, what="start")
        self.pids = [pid for _, pid in replies]
        self._ready = True

    def call(self, fn, args: tuple, kwargs: dict, timeout: float) -> list:
        """Run ``fn(*args, **kwargs)`` on every rank; relay output; return results by rank."""
        payload = cloudpickle.dumps((fn, args, kwargs))
        self._fn = fn  # only to find the student's source lines if something goes wrong
        self.call_id += 1
        self.last_used = time.monotonic()
        with self._in_flight():
            message = pickle.dumps(("call", self.call_id, payload))
            for rank, conn in enumerate(self.conns):
                try:
                    conn.send_bytes(message)
                except OSError:  # the rank died just before the call reached it
                    raise self._death_error(rank, "before this call reached it") from None
            replies = self._collect(timeout, what="call")
        return [value for _, _, value in replies]

    def dead_ranks(self) -> dict[int, str]:
        """Ranks that died since the last call (e.g. the out-of-memory killer), with the cause.

        Between calls a rank never writes to its pipe, so a readable pipe means end-of-file (the
        rank is gone) or a stray reply; either way the pool cannot serve another call.
        """
        dead = {}
        for rank, conn in enumerate(self.conns):
            try:
                readable = conn.poll()
            except (OSError, ValueError):
                readable = True
            if readable:
                dead[rank] = self._exit_cause(rank)
        return dead

    def _exit_cause(self, rank: int) -> str:
        proc = self.procs[rank]
        if not self.orphaned:
            proc.join(0.5)
        return death_cause(None if self.orphaned else proc.exitcode)

    def _death_error(self, rank: int, when: str) -> RankError:
        return RankError(rank, f"rank {rank} died ({self._exit_cause(rank)}) {when}; see its "
                         "output above. The pool was stopped; the next run() starts a fresh one.",
                         "ProcessDied")

    @contextlib.contextmanager
    def _in_flight(self):
        """While ranks hold a message of ours, any exception (a rank error, a timeout, Ctrl-C,
        a reply that does not unpickle) kills the pool: replies left in the pipes must never
        answer a later call."""
        try:
            yield
        except BaseException:
            if not self.broken:
                self.kill(remove_files=False)
            raise
        finally:
            self.relay_output()
            if self.broken:  # files were kept only so that the output of a failed call is shown
                shutil.rmtree(self.workdir, ignore_errors=True)
            self.last_used = time.monotonic()

    def _collect(self, timeout: float, what: str) -> list:
        """Wait for one reply per rank. Raises RankError / RankTimeoutError (the caller's
        ``_in_flight`` then kills the pool, as on Ctrl-C: every rank goes, now)."""
        deadline = time.monotonic() + timeout
        replies: dict[int, tuple] = {}
        errors: dict[int, RankError] = {}
        died: list[int] = []  # in the order their deaths were seen
        first_error_at = None
        while len(replies) + len(errors) < self.world_size:
            pending = [r for r in range(self.world_size) if r not in replies and r not in errors]
            until = deadline if first_error_at is None else min(deadline, first_error_at + ERROR_GRACE)
            remaining = until - time.monotonic()
            if remaining <= 0:
                break
            waitables = {self.conns[r]: r for r in pending}
            if not self.orphaned:  # a dead forkserver makes every sentinel readable
                waitables.update({self.procs[r].sentinel: r for r in pending})
            ready = wait(list(waitables), timeout=min(remaining, MAX_WAIT_SLICE))
            for obj in ready:
                rank = waitables[obj]
                if rank in replies or rank in errors:
                    continue
                if obj is not self.conns[rank] and not self.conns[rank].poll():
                    self.orphaned = True  # sentinel says "exited", its pipe says "alive"
                    continue
                self._receive(rank, what, replies, errors, died)
            if errors and first_error_at is None:
                first_error_at = time.monotonic()
        pending = [r for r in range(self.world_size) if r not in replies and r not in errors]
        if errors:
            raise blame(errors, died)
        if pending:
            pids = {r: self.procs[r].pid for r in pending}
            waiting = (ask_where_waiting(pids, self.workdir, self._fn)
                       if what == "call" else {r: None for r in pending})
            message = timeout_message(timeout, sorted(replies), waiting)
            if what == "start":
                message = f"the rank pool of {self.world_size} did not start.\n" + message
            raise RankTimeoutError(message, sorted(replies), waiting)
        return [replies[r] for r in range(self.world_size)]

    def _receive(self, rank: int, what: str, replies: dict, errors: dict, died: list) -> None:
        conn = self.conns[rank]
        try:
            data, buffers = rank_worker.recv_reply(conn)
        except (EOFError, OSError):
            died.append(rank)
            errors[rank] = self._death_error(rank, "without answering")
            return
        try:
            message = pickle.loads(data, buffers=buffers)
        except Exception as exc:  # noqa: BLE001  (a class only the rank has, a broken __reduce__)
            errors[rank] = RankError(
                rank, f"rank {rank}'s result could not be unpickled here: {type(exc).__name__}: "
                f"{exc}. Return plain data or tensors (a class defined only on the ranks cannot "
                "travel back).", "UnpicklingError")
            return
        if what == "start":
            replies[rank] = message
        elif message[1] < self.call_id:  # a reply a failed call left behind: never ours
            return
        elif message[1] != self.call_id:
            errors[rank] = RankError(rank, f"rank {rank} answered call {message[1]} while call "
                                     f"{self.call_id} was waiting; the pool was stopped.",
                                     "StaleReply")
        elif message[0] == "error":
            _, _, exc_type, exc_msg, frames, raw = message
            text = format_remote_traceback(rank, exc_type, exc_msg, frames,
                                           SourceIndex(self._fn))
            errors[rank] = RankError(rank, f"rank {rank} raised {exc_type}: {exc_msg}\n\n{text}",
                                     exc_type, raw)
        else:
            replies[rank] = message

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
        """After the call in flight, if any, kill every rank: an idle rank holds nothing to save
        (its output was relayed, its work dir goes), so there is no goodbye to wait for."""
        with self.lock:
            self.kill()

    def kill(self, remove_files: bool = True) -> None:
        """Kill every rank now. A second Ctrl-C cannot cut this short (it is held back)."""
        with interrupts_deferred():
            self.broken = True
            started = [proc for proc in self.procs if proc.pid is not None]
            for proc in started:
                if self.orphaned or proc.is_alive():
                    try:  # by pid: a process whose forkserver died reports "exited" while alive
                        os.kill(proc.pid, getattr(signal, "SIGKILL", signal.SIGTERM))
                    except (OSError, TypeError):
                        pass
            for proc in started:
                if not self.orphaned:
                    proc.join(2.0)
            for conn in self.conns + self._lifelines:
                conn.close()
            if remove_files:
                shutil.rmtree(self.workdir, ignore_errors=True)
