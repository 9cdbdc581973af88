"""``minitrainbench tp check | mlp | attention | vocab``: the TP checks (01-03, 10), headless.
``tp check`` runs the column and the row layer; ``tp attention`` and ``tp vocab`` are notebook 10's."""
from __future__ import annotations

import argparse

from mtb_helpers.checking.bug import resolve, showing
from mtb_helpers.checking.command import add_command, check_args, check_command, emit
from mtb_helpers.comm.sharding import check_divisible
from mtb_helpers.runtime.ranks import resolve_world_size
from mtb_helpers.tp.attention_check import check_tp_attention
from mtb_helpers.tp.check import check_column_parallel, check_row_parallel, check_tp_mlp
from mtb_helpers.tp.vocab_check import check_vocab_parallel


def register(top: argparse._SubParsersAction, groups: dict[str, argparse._SubParsersAction]) -> None:
    """Add ``check``, ``mlp``, ``attention`` and ``vocab`` (notebook 10) to ``minitrainbench tp``."""
    batch_shape = ([2, 3], "leading dims of X (default: 2 3)")
    add_command(
        groups["tp"], "check", "column- and row-parallel linear layers against one process",
        "Run ColumnParallelLinear and RowParallelLinear on real gloo ranks and compare forward "
        "output, input grad, weight grad and bias grad on every rank with a single-process "
        "reference. --bug injects a deliberate bug into the layer it concerns.", run_check,
        in_features=(12, "input features of both layers"),
        out_features=(12, "output features of both layers"), batch_shape=batch_shape,
        gather_output=(False, "column layer all-gathers its output (a --bug that needs it turns "
                              "it on)"),
        full_input=(False, "row layer gets the full X and splits it (input_is_parallel=False)"))
    add_command(
        groups["tp"], "mlp", "the tensor-parallel MLP (column -> GeLU -> row) against one process",
        "Run ParallelMLP on real gloo ranks and compare its output and every grad on every rank "
        "with a single-process reference.", check_command(check_tp_mlp),
        hidden=(6, "model width h (default 6)"),
        ffn_hidden=(24, "MLP width, split over ranks (24)"), batch_shape=batch_shape)
    add_command(
        groups["tp"], "attention",
        "tensor-parallel self-attention (heads split over ranks) against one process",
        "Run ParallelSelfAttention (Q/K/V column-parallel by heads, Wo row-parallel: one f, one "
        "g) on real gloo ranks and compare output, input grad and every weight and bias grad on "
        "every rank with nn.Linear + scaled_dot_product_attention on one process.",
        check_command(check_tp_attention, heads="n_heads"),
        seq=(4, "sequence length s (default 4)"), batch=(2, "batch size b (default 2)"),
        heads=(4, "attention heads n, split over ranks (4)"),
        head_dim=(4, "features per head d (default 4)"),
        no_causal={"action": "store_false", "dest": "causal", "help": "attend to every position"})
    add_command(
        groups["tp"], "vocab", "vocab-parallel embedding and cross-entropy against one process",
        "Run VocabParallelEmbedding and vocab_parallel_cross_entropy on real gloo ranks (each "
        "rank owns V/t tokens) and compare the embedding, its grad, the three all-reduced "
        "numbers of the loss, the loss and the logits grad with nn.Embedding and "
        "F.cross_entropy on one process.", check_command(check_vocab_parallel),
        vocab=(12, "vocabulary size V (default 12)"), hidden=(4, "embedding width h (default 4)"),
        tokens=([4, 2], "shape of the token ids (default: 4 2)"),
        reduction={"choices": ("mean", "sum", "none"), "default": "mean"})


def run_check(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench tp check``: column then row; a bug goes to the layer it breaks."""
    bug = resolve(args.bug, ("column", "row"))
    # both layers' shapes are checked before the column check starts any rank
    t = resolve_world_size(args.world_size)
    check_divisible("out_features", args.out_features, t)
    check_divisible("in_features", args.in_features, t)
    sizes = {**check_args(args), "in_features": args.in_features,
             "out_features": args.out_features, "batch_shape": tuple(args.batch_shape)}
    column_bug, row_bug = (args.bug if bug and layer in bug.checks else None
                           for layer in ("column", "row"))
    column = check_column_parallel(**dict(sizes, bug=column_bug), **showing(
        column_bug, {"gather_output": args.gather_output}))
    row = check_row_parallel(**dict(sizes, bug=row_bug), input_is_parallel=not args.full_input)
    return emit([column, row], args.json)
