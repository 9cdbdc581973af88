"""``minitrainbench tp attention`` and ``minitrainbench tp vocab``: notebook 10's checks, headless.

Each prints the report table (or, with ``--json``, ``{"passed": ..., "checks": [report.to_dict()]}``)
and exits 0 when the check passes, 1 when it fails; bad arguments raise ValueError before any rank
starts, which the top-level command turns into exit 2. The commands join the ``tp`` group.
"""
from __future__ import annotations

import argparse

from mtb_helpers.checking.command import add_check_options, emit


def register(top: argparse._SubParsersAction, groups: dict[str, argparse._SubParsersAction]) -> None:
    """Add ``attention`` and ``vocab`` to ``minitrainbench tp`` (notebook 10)."""
    attention = groups["tp"].add_parser(
        "attention", help="tensor-parallel self-attention (heads split over ranks) against one process",
        description="Run ParallelSelfAttention (Q/K/V column-parallel by heads, Wo row-parallel: "
                    "one f, one g) on real gloo ranks and compare output, input grad and every "
                    "weight and bias grad on every rank with nn.Linear + scaled_dot_product_attention "
                    "on one process.")
    add_check_options(attention)
    attention.add_argument("--seq", type=int, default=4, help="sequence length s (default 4)")
    attention.add_argument("--batch", type=int, default=2, help="batch size b (default 2)")
    attention.add_argument("--heads", type=int, default=4, help="attention heads n, split over ranks (4)")
    attention.add_argument("--head-dim", type=int, default=4, help="features per head d (default 4)")
    attention.add_argument("--no-causal", action="store_true", help="attend to every position")
    attention.set_defaults(func=run_attention)

    vocab = groups["tp"].add_parser(
        "vocab", help="vocab-parallel embedding and cross-entropy against one process",
        description="Run VocabParallelEmbedding and vocab_parallel_cross_entropy on real gloo "
                    "ranks (each rank owns V/t tokens) and compare the embedding, its grad, the "
                    "three all-reduced numbers of the loss, the loss and the logits grad with "
                    "nn.Embedding and F.cross_entropy on one process.")
    add_check_options(vocab)
    vocab.add_argument("--vocab", type=int, default=12, help="vocabulary size V (default 12)")
    vocab.add_argument("--hidden", type=int, default=4, help="embedding width h (default 4)")
    vocab.add_argument("--tokens", type=int, nargs="+", default=[4, 2], metavar="N",
                       help="shape of the token ids (default: 4 2)")
    vocab.add_argument("--reduction", choices=("mean", "sum", "none"), default="mean")
    vocab.set_defaults(func=run_vocab)


def run_attention(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench tp attention``."""
    from mtb_helpers.attention.check import check_tp_attention

    report = check_tp_attention(world_size=args.world_size, seq=args.seq, batch=args.batch,
                                n_heads=args.heads, head_dim=args.head_dim,
                                causal=not args.no_causal, dtype=args.dtype, seed=args.seed,
                                bug=args.bug)
    return emit([report], args.json)


def run_vocab(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench tp vocab``."""
    from mtb_helpers.attention.vocab_check import check_vocab_parallel

    report = check_vocab_parallel(world_size=args.world_size, vocab=args.vocab,
                                  hidden=args.hidden, tokens=tuple(args.tokens),
                                  reduction=args.reduction, dtype=args.dtype, seed=args.seed,
                                  bug=args.bug)
    return emit([report], args.json)
