"""``minitrainbench tp check | mlp | attention | vocab``: the TP checks (01-03, 10), headless.

``tp check`` runs the column and the row layer; ``tp attention`` and ``tp vocab`` are notebook 10's.

Each prints the report table of every check it ran (or, with ``--json``, ``{"passed": ...,
"checks": [report.to_dict(), ...]}``) and exits 0 when all pass, 1 when one fails; bad arguments
raise ValueError before any rank starts, which the top-level command turns into exit 2. Under
torchrun every rank runs the checks inside the launched group and only rank 0 prints.
"""
from __future__ import annotations

import argparse

from mtb_helpers.checking.command import add_check_options, emit


def register(top: argparse._SubParsersAction, groups: dict[str, argparse._SubParsersAction]) -> None:
    """Add ``check``, ``mlp``, ``attention`` and ``vocab`` (notebook 10) to ``minitrainbench tp``."""
    check = groups["tp"].add_parser(
        "check", help="column- and row-parallel linear layers against one process",
        description="Run ColumnParallelLinear and RowParallelLinear on real gloo ranks and compare "
                    "forward output, input grad, weight grad and bias grad on every rank with a "
                    "single-process reference. --bug injects a deliberate bug into the layer it concerns.")
    add_check_options(check)
    check.add_argument("--in-features", type=int, default=12, help="input features of both layers")
    check.add_argument("--out-features", type=int, default=12, help="output features of both layers")
    check.add_argument("--batch-shape", type=int, nargs="+", default=[2, 3], metavar="N",
                       help="leading dims of X (default: 2 3)")
    check.add_argument("--gather-output", action="store_true",
                       help="column layer all-gathers its output (a --bug that needs it turns it on)")
    check.add_argument("--full-input", action="store_true",
                       help="row layer gets the full X and splits it (input_is_parallel=False)")
    check.set_defaults(func=run_check)

    mlp = groups["tp"].add_parser(
        "mlp", help="the tensor-parallel MLP (column -> GeLU -> row) against one process",
        description="Run ParallelMLP on real gloo ranks and compare its output and every grad on "
                    "every rank with a single-process reference.")
    add_check_options(mlp)
    mlp.add_argument("--hidden", type=int, default=6, help="model width h (default 6)")
    mlp.add_argument("--ffn-hidden", type=int, default=24, help="MLP width, split over ranks (24)")
    mlp.add_argument("--batch-shape", type=int, nargs="+", default=[2, 3], metavar="N")
    mlp.set_defaults(func=run_mlp)

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


def _common(args: argparse.Namespace) -> dict:
    return {"world_size": args.world_size, "dtype": args.dtype, "seed": args.seed,
            "batch_shape": tuple(args.batch_shape)}


def run_check(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench tp check``: column then row; a bug goes to the layer it breaks."""
    from mtb_helpers.checking.bug import resolve, showing
    from mtb_helpers.tp.check import check_column_parallel, check_row_parallel
    from mtb_helpers.runtime.ranks import resolve_world_size
    from mtb_helpers.comm.sharding import check_divisible
    from mtb_helpers.tp.bugs import COLUMN_BUGS, ROW_BUGS

    resolve(args.bug, ("column", "row"))
    # both layers' shapes are checked before the column check starts any rank
    t = resolve_world_size(args.world_size)
    check_divisible("out_features", args.out_features, t)
    check_divisible("in_features", args.in_features, t)
    sizes = {"in_features": args.in_features, "out_features": args.out_features}
    column_bug = args.bug if args.bug in COLUMN_BUGS else None
    column = check_column_parallel(**_common(args), bug=column_bug, **showing(
        column_bug, {**sizes, "gather_output": args.gather_output}))
    row = check_row_parallel(**_common(args), **sizes, bug=args.bug if args.bug in ROW_BUGS else None,
                             input_is_parallel=not args.full_input)
    return emit([column, row], args.json)


def run_mlp(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench tp mlp``."""
    from mtb_helpers.tp.check import check_tp_mlp

    report = check_tp_mlp(**_common(args), hidden=args.hidden, ffn_hidden=args.ffn_hidden, bug=args.bug)
    return emit([report], args.json)


def run_attention(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench tp attention``."""
    from mtb_helpers.tp.attention_check import check_tp_attention

    report = check_tp_attention(world_size=args.world_size, seq=args.seq, batch=args.batch,
                                n_heads=args.heads, head_dim=args.head_dim,
                                causal=not args.no_causal, dtype=args.dtype, seed=args.seed,
                                bug=args.bug)
    return emit([report], args.json)


def run_vocab(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench tp vocab``."""
    from mtb_helpers.tp.vocab_check import check_vocab_parallel

    report = check_vocab_parallel(world_size=args.world_size, vocab=args.vocab,
                                  hidden=args.hidden, tokens=tuple(args.tokens),
                                  reduction=args.reduction, dtype=args.dtype, seed=args.seed,
                                  bug=args.bug)
    return emit([report], args.json)
