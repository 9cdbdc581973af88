"""One rank of the pipeline: its model chunks, its activation stash and the ops F, B, I, W.

Rank r of p holds the pieces of virtual stages ``vs = c*p + r`` for chunks c = 0..v-1 (Megatron's
interleaved layout; v = 1 is one piece per rank). Notation: micro-batch ``x_i`` is ``[b/m, h]``,
piece vs maps ``[b/m, h] -> [b/m, h]``; the last virtual stage ends with the loss.

    F(i, c)  receive x_i from stage vs-1 (or take the batch's slice on vs = 0), run the piece,
             stash what backward needs, send y_i to stage vs+1 (or compute loss_i / m on the last)
    B(i, c)  receive dy_i from stage vs+1, backward through the stash, send dx_i to stage vs-1
    I(i, c)  ZB-H1: the input grad only, dx_i = torch.autograd.grad(y_i, x_i, dy_i); sent at once
    W(i, c)  ZB-H1: the weight grads, deferred, torch.autograd.grad(y_i, params, dy_i); frees the
             stash

With ``recompute=True`` F runs under ``no_grad`` and stashes only x_i; B (or I) re-runs the piece
forward with grad enabled first (activation checkpointing). The bytes a micro-batch adds to a stage
are measured with ``torch.autograd.graph.saved_tensors_hooks``: every tensor autograd saves, by
the bytes that tensor itself spans (a ``chunk`` view of the batch counts its rows, not the batch),
bytes shared by several saved tensors once, the piece's parameters not at all (they are held
whatever the schedule). Recompute's stashed x_i is counted by the same rule (``held_bytes``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from mtb_helpers.pp.p2p import ACTIVATION, GRAD, P2P, Message
from mtb_helpers.pp.schedules import Op
from mtb_helpers.runtime.link import active_time_scale

__all__ = ["RankStage", "Stash", "held_bytes"]


@dataclass
class Stash:
    """What one micro-batch leaves on a stage between its F and its B (or W)."""
    inp: torch.Tensor                 # x_i [b/m, h], requires grad unless vs == 0
    out: torch.Tensor | None          # y_i (or loss_i / m on the last stage); None when recomputed
    nbytes: int                       # bytes held for this micro-batch (saved tensors or x_i)
    grad: torch.Tensor | None = None  # dy_i, kept from I to W (zb-h1)


@dataclass
class RankStage:
    """Rank ``rank``'s chunks and the state of one pipeline step (see the module docstring)."""
    rank: int
    stages: int
    microbatches: int
    pieces: dict[int, nn.Module]          # chunk c -> piece of virtual stage c*p + rank
    x: list[torch.Tensor]                 # the m input micro-batches (used on virtual stage 0)
    target: list[torch.Tensor]            # the m targets (used on the last virtual stage)
    loss_fn: object
    p2p: P2P
    inputs: list[tuple[torch.Size, torch.dtype]]   # shape and dtype entering each virtual stage
    recompute: bool = False
    pace: Callable[[], None] | None = None   # holds the op to its fixed time (op_time), or None
    # count the bytes each micro-batch leaves stashed (``held_bytes``; peak_bytes,
    # recomputed_bytes); a caller that never reads them (the capstone) saves the hook on every
    # saved tensor and the sum over them (~1 ms of Python per F on a slow CPU). Without it every
    # stash counts 0 bytes.
    count_saved: bool = True
    stash: dict[tuple[int, int], Stash] = field(default_factory=dict)
    losses: dict[int, float] = field(default_factory=dict)
    held: int = 0
    peak_stashed: int = 0
    peak_bytes: int = 0
    recomputed_bytes: int = 0

    @property
    def last(self) -> int:
        return self.stages * len(self.pieces) - 1

    def virtual(self, chunk: int) -> int:
        return chunk * self.stages + self.rank

    def owner(self, virtual_stage: int) -> int:
        return virtual_stage % self.stages

    # ---- the four ops ----------------------------------------------------------------------

    def forward(self, i: int, c: int) -> None:
        vs = self.virtual(c)
        inp = self.x[i] if vs == 0 else self.receive_activation(i, vs)
        if self.recompute:
            with torch.no_grad():
                out = self.apply(c, i, inp)   # nothing saved for backward: it re-runs this
            nbytes = held_bytes([inp]) if self.count_saved else 0
        else:
            out, nbytes = self.run_piece(c, i, inp)
        self.computed()
        if vs == self.last:
            self.losses[i] = float(out.detach())     # loss_i / m, summed over i by the owner
        else:
            self.p2p.send(out, Message(ACTIVATION, vs, i, self.rank, self.owner(vs + 1)))
        self.push(i, c, Stash(inp, None if self.recompute else out, nbytes))

    def backward(self, i: int, c: int) -> None:
        st = self.stash.pop(self.stashed(i, c))
        self.release(st)
        out, grad = self.output_and_grad(st, i, c)
        # loss_i / m (or y_i with dy_i) -> backward -> x.grad [b/m, h] and dW accumulated in .grad
        torch.autograd.backward(out, grad)
        self.computed()
        if self.virtual(c) > 0:
            self.send_input_grad(st.inp.grad, i, c)

    def input_grad(self, i: int, c: int) -> None:
        st = self.stash[self.stashed(i, c)]
        out, st.grad = self.output_and_grad(st, i, c)
        st.out = out
        if self.virtual(c) > 0:
            # y_i, dy_i -> autograd.grad wrt x_i only -> dx_i [b/m, h]; the graph stays for W
            (dx,) = torch.autograd.grad(out, st.inp, st.grad, retain_graph=True)
            self.computed()
            self.send_input_grad(dx, i, c)

    def weight_grad(self, i: int, c: int) -> None:
        st = self.stash.pop(self.stashed(i, c))
        self.release(st)
        params = [p for p in self.pieces[c].parameters() if p.requires_grad]
        # y_i, dy_i -> autograd.grad wrt this piece's parameters -> dW, accumulated like .backward
        grads = torch.autograd.grad(st.out, params, st.grad)
        for p, g in zip(params, grads):
            p.grad = g if p.grad is None else p.grad + g

    def receives(self, op) -> list[tuple[torch.Size, torch.dtype, Message]]:
        """What ``op`` (an ``Op``) receives: F the activation from virtual stage vs-1 (none on
        stage 0), B or I the output grad from vs+1 (none on the last stage, whose grad is the
        loss's); as (shape, dtype, message), the arguments of ``P2P.recv``."""
        vs, i = self.virtual(op.chunk), op.microbatch
        if op.kind == "F" and vs > 0:
            return [(*self.inputs[vs], Message(ACTIVATION, vs - 1, i, self.owner(vs - 1), self.rank))]
        if op.kind in "BI" and vs < self.last:
            return [(*self.inputs[vs + 1], Message(GRAD, vs + 1, i, self.owner(vs + 1), self.rank))]
        return []

    def computed(self) -> None:
        """The op's compute is done: with fixed op times, wait out the rest of it now, before
        its result is sent (a receiver must not start earlier than a real kernel would allow)."""
        if self.pace is not None:
            self.pace()

    # ---- the pieces a deliberate bug overrides -------------------------------------------------

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """loss_i / m: the sum over the m micro-batches is then the whole batch's mean."""
        return loss / self.microbatches

    def stashed(self, i: int, c: int) -> tuple[int, int]:
        """The stash entry micro-batch i's backward on chunk c uses: its own."""
        return (i, c)

    def send_input_grad(self, dx: torch.Tensor, i: int, c: int) -> None:
        """dx_i [b/m, h] -> send -> the rank of virtual stage vs-1."""
        vs = self.virtual(c)
        self.p2p.send(dx, Message(GRAD, vs, i, self.rank, self.owner(vs - 1)))

    def receive_activation(self, i: int, vs: int) -> torch.Tensor:
        """x_i from virtual stage vs-1, as a leaf that collects its input grad."""
        [message] = self.receives(Op("F", i, vs // self.stages))
        return self.p2p.recv(*message).requires_grad_()

    # ---- helpers ------------------------------------------------------------------------------

    def run_piece(self, c: int, i: int, inp: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Piece c on x_i with autograd on (plus the scaled loss on the last virtual stage);
        returns the output and the bytes autograd saved for backward (``held_bytes``: each
        saved tensor by the bytes it spans, shared bytes once, parameters excluded)."""
        if not self.count_saved:
            return self.apply(c, i, inp), 0
        saved: list[torch.Tensor] = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            saved.append(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = self.apply(c, i, inp)
        params = {p.untyped_storage().data_ptr() for p in self.pieces[c].parameters()}
        return out, held_bytes(saved, exclude=params)

    def apply(self, c: int, i: int, inp: torch.Tensor) -> torch.Tensor:
        out = self.pieces[c](inp)   # [b/m, h] -> piece vs -> [b/m, h]
        if self.virtual(c) == self.last:
            out = self.scale_loss(self.loss_fn(out, self.target[i]))   # -> scalar loss_i / m
        return out

    def output_and_grad(self, st: Stash, i: int, c: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """y_i (re-run now when recomputing) and dy_i (received; None for the loss)."""
        vs = self.virtual(c)
        out = st.out
        if out is None:   # recompute: the forward again, this time keeping what backward needs
            out, nbytes = self.run_piece(c, i, st.inp)
            self.recomputed_bytes = max(self.recomputed_bytes, nbytes)
        if vs == self.last:
            return out, None
        [message] = self.receives(Op("B", i, c))   # dy_i [b/m, h], shaped as y_i
        return out, self.p2p.recv(*message)

    def push(self, i: int, c: int, st: Stash) -> None:
        self.stash[(i, c)] = st
        self.peak_stashed = max(self.peak_stashed, len(self.stash))
        self.held += st.nbytes
        self.peak_bytes = max(self.peak_bytes, self.held)

    def release(self, st: Stash) -> None:
        self.held -= st.nbytes


def held_bytes(tensors: list[torch.Tensor], exclude: set[int] = frozenset()) -> int:
    """Bytes ``tensors`` hold: each tensor by the bytes of its storage it spans (a view counts
    its own elements, not its base's), bytes spanned by several tensors once, and nothing for a
    storage whose address is in ``exclude`` (the parameters)."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for t in tensors:
        ptr = t.untyped_storage().data_ptr()
        if ptr in exclude or t.numel() == 0:
            continue
        size = t.element_size()
        start = t.storage_offset() * size
        extent = (1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))) * size
        spans.setdefault(ptr, []).append((start, start + extent))
    total = 0
    for intervals in spans.values():   # union of [start, end) byte ranges per storage
        end = -1
        for a, b in sorted(intervals):
            if b > end:
                total += b - max(a, end)
                end = b
    return total


def pad(start: float, seconds: float | None) -> None:
    """Hold the op until ``seconds`` after ``start`` (a fixed op time, as a GPU kernel has),
    stretched by the time scale of an emulated link (``run(..., link=, time_scale=)``) like
    every other modelled time."""
    if seconds:
        remaining = start + seconds * active_time_scale() - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
