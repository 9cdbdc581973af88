"""``minitrainbench tp sequence``: the sequence-parallel check, headless: the report, then the max
errors and the activation-memory figures (bytes saved for backward per rank, TP only vs TP + SP,
measured and modelled, and the bytes sent; in the JSON: ``"activation_memory"``)."""
from __future__ import annotations

import argparse

from mtb_helpers.checking.command import add_command, check_command
from mtb_helpers.sp.check import check_sequence_parallel
from mtb_helpers.sp.memory import memory_table


def register(top: argparse._SubParsersAction, groups: dict[str, argparse._SubParsersAction]) -> None:
    """Add ``sequence`` to ``minitrainbench tp``."""
    add_command(
        groups["tp"], "sequence", "the sequence-parallel MLP block against one process, and its memory",
        "Run SequenceParallelMLPBlock (LayerNorm and dropout on sequence shards, all-gather / "
        "reduce-scatter around the tensor-parallel MLP) on real gloo ranks and compare output, "
        "dropout, input grad, LayerNorm and linear grads on every rank with a single-process "
        "reference; then print the bytes each rank saves for backward with TP only and with "
        "TP + SP.", check_command(check_sequence_parallel, _memory, dropout="dropout_p"),
        seq_len=(8, "sequence length s, split over ranks (8)"),
        batch=(2, "batch size b (2)"), hidden=(8, "model width h (8)"),
        ffn_hidden=(32, "MLP width, split over ranks (32)"),
        dropout=(0.1, "dropout probability p (0.1)"))


def _memory(report) -> str:
    worst = {q: max(r.max_abs_err for r in report.rows if r.quantity == q)
             for q in report.quantities()}
    return ("\nmax abs error over ranks: " + ", ".join(f"{q} {e:.1e}" for q, e in worst.items())
            + "\n\nactivation memory (bytes saved for backward per rank) and bytes sent per rank:\n"
            + memory_table(report.extra["activation_memory"]))
