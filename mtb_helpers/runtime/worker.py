"""The rank side of the runtime: the loop each gloo rank process runs.

A rank joins the process group once, then serves calls from its owner until it is killed:
receive ``(fn, args, kwargs)`` shipped by value (cloudpickle), run it, reply with the pickled
result or the structured traceback. Its stdout and stderr are redirected at the file-descriptor
level into files the owner reads after each call, so C++ (gloo) output is caught too and nothing
reaches a notebook cell directly.

This module is preloaded into the forkserver, so it must stay cheap to import beyond torch.
"""
from __future__ import annotations

import copyreg
import ctypes
import faulthandler
import gc
import io
import os
import pickle
import signal
import socket
import sys
import threading
import traceback
from datetime import timedelta
from multiprocessing.connection import Connection, wait

import torch
import torch.distributed as dist

from mtb_helpers.runtime import allocator

# Collectives the owner waits on are bounded by the call's own timeout; the process group's
# timeout only has to stop a rank that somehow outlives its owner's watch.
PROCESS_GROUP_TIMEOUT = timedelta(minutes=10)
IN_RANK = False  # True inside a rank process: run() refuses to start ranks from a rank


def batch_scheduling() -> None:
    """This thread, and every thread it starts from now on, under Linux's ``SCHED_BATCH``: a rank
    woken by a message waits for its turn instead of preempting whoever runs. A collective is a
    ping-pong of wake-ups; with all ranks on one CPU (Binder) the capstone took 18 % less CPU so
    (BENCHMARKS.md). The kernel keeps the normal policy, so a widget still answers promptly."""
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_BATCH"):
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        except OSError:
            pass


def main(rank: int, world_size: int, workdir: str, conn: Connection, lifeline: Connection) -> None:
    """Entry point of a rank process; serves calls until the owner kills it or disappears."""
    global IN_RANK
    IN_RANK = True
    batch_scheduling()   # first: every thread started after this (gloo's) inherits it
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the owner handles interrupts and kills us
    _redirect_output(rank, workdir)
    _watch_owner(lifeline)
    if hasattr(signal, "SIGUSR1"):  # the owner's "where are you waiting?" question
        stack_file = open(os.path.join(workdir, f"rank{rank}.stack"), "a")
        faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    # One intra-op thread per rank (4 ranks on 2 cores oversubscribe otherwise), set here, in the
    # rank, before it computes anything: importing the package leaves the owner's threads alone.
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    allocator.tune()
    try:   # gloo listens on the loopback interface (Linux "lo", macOS "lo0"), never a public one
        names = {name for _, name in socket.if_nameindex()}
    except (OSError, AttributeError):
        names = set()
    iface = next((n for n in ("lo", "lo0") if n in names), None)
    if iface is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = iface
    # PyTorch's flight recorder keeps every collective with its Python stack (for dumping a hung
    # NCCL job): ~0.01 ms an op here, ~8 % of a capstone redraw on one CPU. The course's own
    # timeout names a hang's waiting ranks and their stacks; a user's own setting is kept.
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "0")
    store = dist.FileStore(os.path.join(workdir, "store"), world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=PROCESS_GROUP_TIMEOUT)
    conn.send_bytes(pickle.dumps(("ready", os.getpid())))
    try:
        _serve(conn)
    finally:
        _flush()
        dist.destroy_process_group()


def _serve(conn: Connection) -> None:
    while True:
        try:
            message = pickle.loads(conn.recv_bytes())
        except EOFError:  # the owner went away between calls
            return
        _, call_id, payload = message
        send_reply(conn, *_execute(call_id, payload))
        # after the reply (the owner does not wait for it): the call's cyclic garbage (autograd
        # graphs, wrappers and their hooks) waited for a rare full collection, and held its
        # pages until then (notebook 14: +2 MiB a rank per FSDP step measured); the collector
        # scans only what this rank built (the forkserver froze the rest), ~1 ms
        gc.collect()
        allocator.trim()


def _execute(call_id: int, payload: bytes) -> tuple[bytes, list]:
    """Run one shipped call; return the pickled reply, tagged with the call's id, and its
    out-of-band buffers (see :func:`_dumps`). Never raises."""
    try:
        fn, args, kwargs = pickle.loads(payload)
        result = fn(*args, **kwargs)
        reply = _dumps(("ok", call_id, result))
    except BaseException as exc:  # noqa: BLE001  (everything goes back to the owner)
        frames = [(f.filename, f.lineno, f.name, f.line) for f in
                  traceback.extract_tb(exc.__traceback__)[1:]]  # drop this frame
        reply = pickle.dumps(("error", call_id, type(exc).__name__, _safe_str(exc), frames,
                              traceback.format_exc())), []
    finally:
        _flush()
    return reply


# Tensors go back as numpy arrays (the owner unpickles them with torch.from_numpy): torch's own
# pickling writes every storage in torch.save's format, ~0.3 ms a tensor each way, and a check
# returns ~25 tensors per rank, ~50 ms of a slider move on 4 ranks sharing one CPU. Anything
# numpy cannot hold exactly (bfloat16, a tensor needing grad, a subclass such as Parameter)
# keeps torch's pickling. The copy is contiguous: values, dtype and shape are kept, strides not.
_AS_NUMPY = {torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16,
             torch.int8, torch.uint8, torch.bool}


def _reduce_tensor(t: torch.Tensor):
    if (t.dtype in _AS_NUMPY and t.layout is torch.strided and t.device.type == "cpu"
            and not t.requires_grad and not t.is_conj() and not t.is_neg()):
        return torch.from_numpy, (t.numpy(),)
    return t.__reduce_ex__(pickle.DEFAULT_PROTOCOL)


class _ReplyPickler(pickle.Pickler):
    dispatch_table = {**copyreg.dispatch_table, torch.Tensor: _reduce_tensor}


# A reply's large arrays travel out of band (pickle protocol 5): each as a message of its own,
# sent from the tensor's memory and received into the buffer the owner's tensor keeps. In-band, a
# reply was copied twice on each side (notebook 12's snapshots: 3-4 times the reply at its peak).
# Small buffers stay in the stream: a message each would cost more than the copy.
OUT_OF_BAND_BYTES = 64 * 1024
_FRAMES = b"mtb-frames:"   # a reply with out-of-band buffers starts with this message


def _dumps(reply: tuple) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """``reply`` pickled (protocol 5), and the buffers left out of the stream, in its order."""
    buffers: list[pickle.PickleBuffer] = []

    def in_band(buffer: pickle.PickleBuffer) -> bool:
        if buffer.raw().nbytes < OUT_OF_BAND_BYTES:
            return True
        buffers.append(buffer)
        return False

    stream = io.BytesIO()
    _ReplyPickler(stream, protocol=5, buffer_callback=in_band).dump(reply)
    return stream.getvalue(), buffers


def send_reply(conn: Connection, stream: bytes, buffers: list[pickle.PickleBuffer]) -> None:
    """A reply as messages: with buffers, first ``_FRAMES`` and their sizes, then the stream, then
    each buffer; without, the stream alone (what ``recv_reply`` reads back)."""
    if buffers:
        conn.send_bytes(_FRAMES + pickle.dumps([b.raw().nbytes for b in buffers]))
    conn.send_bytes(stream)
    for buffer in buffers:
        conn.send_bytes(buffer.raw())
        buffer.release()


def recv_reply(conn: Connection) -> tuple[bytes, list[bytearray]]:
    """The owner's side of ``send_reply``: ``(stream, buffers)`` for ``pickle.loads(stream,
    buffers=buffers)``; each buffer is a writable bytearray the unpickled array then uses as its
    memory (no copy). Raises EOFError / OSError if the rank went away."""
    data = conn.recv_bytes()
    if not data.startswith(_FRAMES):
        return data, []
    buffers = [bytearray(size) for size in pickle.loads(data[len(_FRAMES):])]
    stream = conn.recv_bytes()
    for buffer in buffers:
        conn.recv_bytes_into(buffer)
    return stream, buffers


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001
        return repr(exc)


def _redirect_output(rank: int, workdir: str) -> None:
    for fd, name in ((1, "stdout"), (2, "stderr")):
        target = os.open(os.path.join(workdir, f"rank{rank}.{name}"),
                         os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(target, fd)
        os.close(target)
    # Spawned children on some platforms start with sys.stdout None; make both real, line-buffered.
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:  # C and C++ stdio buffers (printf from an extension) as well
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError, TypeError):
        pass


def _watch_owner(lifeline: Connection) -> None:
    """Exit at once when the owner dies, even while blocked inside a collective.

    The owner holds the only write end of ``lifeline``; when it dies the pipe reports EOF.
    """
    def watch() -> None:
        wait([lifeline])
        os._exit(3)

    threading.Thread(target=watch, name="mtb-owner-watch", daemon=True).start()
