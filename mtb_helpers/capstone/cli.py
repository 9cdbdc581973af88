"""``minitrainbench train``: the tiny GPT under tp x pp x dp x cp against one process, headless.

Prints the loss of every step next to the single-process loss and the bytes each group sent per
step (rank 0 and all ranks' total, measured and by formula); ``--plot out.png`` saves the loss
curves, ``--json`` prints ``{"passed": ..., "checks": [report]}``. Exit 0 when every step and
every rank's final parameters match, 1 when the check fails, 2 for bad arguments (a layout whose
product is not ``--world-size`` (or torchrun's world size), sizes that do not divide, an unknown bug: one line on stderr).
"""
from __future__ import annotations

import argparse
import os

from mtb_helpers.capstone.validate import DP_STRATEGIES, PP_SCHEDULES
from mtb_helpers.cli.common import is_primary, print_json

__all__ = ["register", "run_train", "loss_table"]


def _bug_help() -> str:
    from mtb_helpers.capstone.bugs import BUGS
    return "deliberate bugs (--bug NAME):\n" + "\n".join(
        f"  {name}\n      {bug.description}" for name, bug in BUGS.items())


def register(top: argparse._SubParsersAction, groups: dict[str, argparse._SubParsersAction]) -> None:
    """Add ``minitrainbench train``."""
    parser = top.add_parser(
        "train", help="train the tiny GPT under tp x pp x dp x cp and compare with one process",
        description="Train the capstone's tiny GPT with tensor (+sequence), pipeline, data and "
                    "context parallelism on tp*pp*dp*cp real gloo ranks, and compare the loss of "
                    "every step and the final parameters with one process.",
        epilog=_bug_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    for dim in ("tp", "pp", "dp", "cp"):
        parser.add_argument(f"--{dim}", type=int, default=1, help=f"{dim} size (1)")
    parser.add_argument("--world-size", type=int, default=None,
                        help="optional: must equal tp*pp*dp*cp")
    parser.add_argument("--steps", type=int, default=20, help="AdamW steps (20)")
    parser.add_argument("--microbatches", type=int, default=2, help="pipeline micro-batches (2)")
    parser.add_argument("--schedule", choices=PP_SCHEDULES, default="1f1b")
    parser.add_argument("--strategy", choices=DP_STRATEGIES, default="ddp")
    parser.add_argument("--no-sequence-parallel", action="store_true",
                        help="tensor parallelism without sequence parallelism")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bug", default=None, help="inject a deliberate bug (listed below)")
    parser.add_argument("--plot", default=None, metavar="PNG", help="save the loss curves here")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run_train)


def loss_table(report) -> str:
    """One line per step: parallel loss, one-process loss, |difference|, tolerance, verdict."""
    losses = report.extra["losses"]
    rows = [r for r in report.rows if r.quantity == "loss"]
    lines = ["step  parallel            one process         |diff|    tolerance  ok",
             "----  ------------------  ------------------  --------  ---------  --"]
    for k, (a, b, row) in enumerate(zip(losses["parallel"], losses["reference"], rows), start=1):
        lines.append(f"{k:4d}  {a:18.15f}  {b:18.15f}  {row.max_abs_err:.1e}   {row.tolerance:.0e}"
                     f"      {'yes' if row.passed else 'NO'}")
    params = [r for r in report.rows if r.quantity == "params"]
    bad = [r.rank for r in params if not r.passed]
    worst = max(r.max_abs_err for r in params)
    lines.append(f"final parameters on {len(params)} ranks: worst error {worst:.1e} "
                 f"(tolerance {params[0].tolerance:.0e})"
                 + (f"; wrong on ranks {', '.join(map(str, bad))}" if bad else ""))
    return "\n".join(lines)


def bytes_table(report) -> str:
    b = report.extra["bytes"]
    head = "bytes sent per step  " + "  ".join(f"{g:>9s}" for g in b["groups"])
    r0 = "rank 0 measured     " + "  ".join(f"{b['per_rank'][0][g]:9d}" for g in b["groups"])
    f0 = "rank 0 formula      " + "  ".join(f"{b['formula'][0][g]:9d}" for g in b["groups"])
    tot = "all ranks measured  " + "  ".join(
        f"{sum(s[g] for s in b['per_rank']):9d}" for g in b["groups"])
    return "\n".join([head, r0, f0, tot])


def run_train(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench train``; returns the exit code."""
    from mtb_helpers.capstone.check import check_capstone

    world = args.tp * args.pp * args.dp * args.cp
    if args.world_size is None and "WORLD_SIZE" in os.environ:   # inside torchrun: its size
        args.world_size = int(os.environ["WORLD_SIZE"])
    if args.world_size is not None and args.world_size != world:
        raise ValueError(f"tp*pp*dp*cp = {args.tp}*{args.pp}*{args.dp}*{args.cp} = {world} is not "
                         f"the world size {args.world_size}")
    report = check_capstone(args.tp, args.pp, args.dp, args.cp, steps=args.steps,
                            microbatches=args.microbatches, schedule=args.schedule,
                            sequence_parallel=not args.no_sequence_parallel,
                            strategy=args.strategy, seed=args.seed, dtype=args.dtype, bug=args.bug)
    if is_primary():
        if args.plot:
            from mtb_helpers.capstone.plots import plot_losses
            losses = report.extra["losses"]
            plot_losses(losses["parallel"], losses["reference"],
                        f"tp={args.tp} pp={args.pp} dp={args.dp} cp={args.cp}").savefig(args.plot)
        if args.json:
            print_json([report])
        else:
            print(report.title())
            print(loss_table(report))
            print(bytes_table(report))
            print("every step matches one process" if report.passed else "FAILED")
    return 0 if report.passed else 1
