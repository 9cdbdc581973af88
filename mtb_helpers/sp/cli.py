"""``minitrainbench tp sequence``: the sequence-parallel check, headless.

Prints the report table (output, dropout, input grad, LayerNorm and linear grads, per rank, with
their max errors) and the activation-memory figures (bytes saved for backward per rank, TP only
vs TP + SP, measured and modelled, and the bytes sent), or with ``--json``
``{"passed": ..., "checks": [report.to_dict()]}`` (the dict carries ``"activation_memory"``).
Exit 0 when the check passes, 1 when it fails; bad arguments raise ValueError before any rank
starts, which the top-level command turns into exit 2. Under torchrun only rank 0 prints.
"""
from __future__ import annotations

import argparse

from mtb_helpers.checking.command import add_check_options, emit


def register(top: argparse._SubParsersAction, groups: dict[str, argparse._SubParsersAction]) -> None:
    """Add ``sequence`` to ``minitrainbench tp``."""
    parser = groups["tp"].add_parser(
        "sequence", help="the sequence-parallel MLP block against one process, and its memory",
        description="Run SequenceParallelMLPBlock (LayerNorm and dropout on sequence shards, "
                    "all-gather / reduce-scatter around the tensor-parallel MLP) on real gloo "
                    "ranks and compare output, dropout, input grad, LayerNorm and linear grads on "
                    "every rank with a single-process reference; then print the bytes each rank "
                    "saves for backward with TP only and with TP + SP.")
    add_check_options(parser)
    parser.add_argument("--seq-len", type=int, default=8, help="sequence length s, split over ranks (8)")
    parser.add_argument("--batch", type=int, default=2, help="batch size b (2)")
    parser.add_argument("--hidden", type=int, default=8, help="model width h (8)")
    parser.add_argument("--ffn-hidden", type=int, default=32, help="MLP width, split over ranks (32)")
    parser.add_argument("--dropout", type=float, default=0.1, help="dropout probability p (0.1)")
    parser.set_defaults(func=run_sequence)


def run_sequence(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench tp sequence``; returns the exit code."""
    from mtb_helpers.sp.check import check_sequence_parallel

    report = check_sequence_parallel(world_size=args.world_size, seq_len=args.seq_len,
                                     batch=args.batch, hidden=args.hidden,
                                     ffn_hidden=args.ffn_hidden, dropout_p=args.dropout,
                                     dtype=args.dtype, seed=args.seed, bug=args.bug)
    return emit([report], args.json, _memory)


def _memory(report) -> str:
    from mtb_helpers.sp.memory import memory_table

    worst = {q: max(r.max_abs_err for r in report.rows if r.quantity == q)
             for q in report.quantities()}
    return ("\nmax abs error over ranks: " + ", ".join(f"{q} {e:.1e}" for q, e in worst.items())
            + "\n\nactivation memory (bytes saved for backward per rank) and bytes sent per rank:\n"
            + memory_table(report.extra["activation_memory"]))
