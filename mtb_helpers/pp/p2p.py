"""Point-to-point messages between pipeline stages: activations forward, input grads backward.

No schedule can deadlock here: a stage never waits for its own sends. ``send`` posts an ``isend``
and returns (gloo completes it when the peer posts the matching ``irecv``); ``recv`` posts the
``irecv`` right before the op that needs the tensor and waits for it. So a rank only waits for
data an earlier op of another rank produces, the dependencies ``simulate()`` follows: if it
finishes a schedule, so do the ranks.

With fixed op times (``op_time``) a rank posts every receive of its step before the step starts
(``expect``), as PyTorch's pipelining does. On one CPU, a receive posted while its message already
waits wakes the sender's network thread while this rank's thread, preempted, holds the lock gloo's
reading thread needs, which then spins for its time slice (~3 ms, measured here): time the chart
showed as the schedule's. Posting earlier only removes waits (a blocking send, the deadlock of
``bugs.BlockingSend``, would find its receive posted: that bug needs ``op_time=None``).

Every message has its own tag, so two messages between one pair of ranks (interleaved: rank r
sends rank r+1 activations of one chunk while it receives grads of another) never match the
wrong receive, whatever order they are posted in::

    tag = (kind * virtual_stages + sender's virtual stage) * microbatches + microbatch

Each send and receive is noted in the rank's collective record (op "send" / "recv", bytes,
``region`` naming what and which peer); each wait for a receive is a "recv" event of the
timeline. Before blocking, a rank writes what it waits for into ``status_file`` (when given), so
the owner can name each rank's p2p op and peer if the step times out. The file is emptied once
the op completes (a rank stuck elsewhere is never reported in a receive it finished), and
rewritten in place: a file created and removed per wait cost ~0.5 ms a message on one CPU.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from mtb_helpers.comm.records import note

__all__ = ["P2P", "Message", "ACTIVATION", "GRAD"]

ACTIVATION, GRAD = 0, 1   # message kinds: forward activation s -> s+1, input grad s -> s-1
_WHAT = {ACTIVATION: "activation", GRAD: "input grad"}


@dataclass(frozen=True)
class Message:
    """One tensor between virtual stages: ``kind`` (ACTIVATION or GRAD) sent by virtual stage
    ``sender`` for ``microbatch``, from rank ``src`` to rank ``dst``."""
    kind: int
    sender: int
    microbatch: int
    src: int
    dst: int

    def tag(self, virtual_stages: int, microbatches: int) -> int:
        return (self.kind * virtual_stages + self.sender) * microbatches + self.microbatch

    def describe(self) -> str:
        """E.g. ``'activation of micro-batch 3 (virtual stage 1 -> 2), rank 1 -> rank 2'``."""
        to = self.sender + (1 if self.kind == ACTIVATION else -1)
        return (f"{_WHAT[self.kind]} of micro-batch {self.microbatch} (virtual stage "
                f"{self.sender} -> {to}), rank {self.src} -> rank {self.dst}")


class P2P:
    """This rank's sends and receives for one pipeline step.

    ``events`` collects ("send" | "recv", message, start, end) with ``clock()`` times; call
    ``finish()`` at the end of the step to wait for the sends still in flight.
    """

    def __init__(self, virtual_stages: int, microbatches: int, clock, status_file: str | None):
        self.virtual_stages = virtual_stages
        self.microbatches = microbatches
        self.clock = clock
        self.status = None if status_file is None else os.open(
            status_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self.said = False   # the status file holds a wait that has not completed
        self.pending: list[tuple[dist.Work, torch.Tensor]] = []
        self.local: dict[int, torch.Tensor] = {}   # messages to this very rank (p = 1, v > 1)
        self.events: list[tuple[str, Message, float, float]] = []
        self.posted: dict[int, tuple[dist.Work, torch.Tensor]] = {}   # tag -> receive, by expect()

    def tag(self, msg: Message) -> int:
        return msg.tag(self.virtual_stages, self.microbatches)

    def waiting_for(self, text: str) -> None:
        """Say what this rank is about to block on, and which line of the stage asked for it
        (read by the owner only after a timeout)."""
        if self.status is not None:
            caller = sys._getframe(2)   # the stage op that called send / recv
            where = caller.f_code.co_filename.replace("\\", "/").split("/mtb_helpers/")[-1]
            said = (f"{text}, called at mtb_helpers/{where}:{caller.f_lineno} "
                    f"({caller.f_code.co_name})").encode()
            os.ftruncate(self.status, 0)
            os.pwrite(self.status, said, 0)
            self.said = True

    def done_waiting(self) -> None:
        """The op this rank blocked on (if any) has completed: nothing is pending any more."""
        if self.said:
            os.ftruncate(self.status, 0)
            self.said = False

    def send(self, tensor: torch.Tensor, msg: Message) -> None:
        """Post the send and return: the peer receives it whenever its schedule gets there."""
        start = self.clock()
        tensor = tensor.detach().contiguous()
        if msg.dst == msg.src:   # one rank holds both virtual stages: hand it over in memory
            self.local[self.tag(msg)] = tensor
        else:
            # [b/m, ...] activation or grad -> isend -> rank msg.dst (kept alive until finish())
            work = dist.isend(tensor, dst=msg.dst, tag=self.tag(msg))
            self.pending.append((work, tensor))
        self._note("send", tensor, msg, start)

    def expect(self, shape: torch.Size, dtype: torch.dtype, msg: Message) -> None:
        """Post the receive of ``msg`` now; ``recv`` of it later only waits (messages from this
        very rank are handed over in memory and need no receive)."""
        if msg.dst != msg.src:
            out = torch.empty(shape, dtype=dtype)
            # rank msg.src -> irecv -> [b/m, ...] activation or grad, posted ahead
            self.posted[self.tag(msg)] = (dist.irecv(out, src=msg.src, tag=self.tag(msg)), out)

    def recv(self, shape: torch.Size, dtype: torch.dtype, msg: Message) -> torch.Tensor:
        """Post the receive (unless ``expect`` did) and wait for it: the time spent waiting is
        this rank's bubble."""
        start = self.clock()
        if msg.dst == msg.src:   # produced earlier by this rank's own op (the schedule's order)
            out = self.local.pop(self.tag(msg))
            self._note("recv", out, msg, start)
            return out
        if self.tag(msg) in self.posted:
            work, out = self.posted.pop(self.tag(msg))
        else:
            out = torch.empty(shape, dtype=dtype)
            # rank msg.src -> irecv -> [b/m, ...] activation or grad
            work = dist.irecv(out, src=msg.src, tag=self.tag(msg))
        if not work.is_completed():   # about to block: say on what, in case it never arrives
            self.waiting_for(f"recv of the {msg.describe()}")
        work.wait()
        self._note("recv", out, msg, start, self.clock())   # arrived: the bookkeeping is not the wait
        return out

    def finish(self) -> None:
        """Wait for every send still in flight (their receivers have all been posted by now)."""
        for work, _ in self.pending:
            self.waiting_for("waiting for its sends to be received at the end of the step")
            work.wait()
        self.pending.clear()
        self.done_waiting()
        self.close()

    def close(self) -> None:
        """Close the status file (the step is over, or failed on this rank)."""
        if self.status is not None:
            os.close(self.status)
            self.status = None

    def _note(self, op: str, tensor: torch.Tensor, msg: Message, start: float,
              end: float | None = None) -> None:
        self.done_waiting()   # called once the op is over (a receive's wait() has returned)
        self.events.append((op, msg, start, self.clock() if end is None else end))
        peer = msg.dst if op == "send" else msg.src
        arrow = "->" if op == "send" else "<-"
        nbytes = tensor.numel() * tensor.element_size()
        note(op, tensor, tensor, f"{_WHAT[msg.kind]} {arrow} rank {peer}", "",
             "forward" if msg.kind == ACTIVATION else "backward", 2,
             sent=nbytes if op == "send" and msg.dst != msg.src else 0)
