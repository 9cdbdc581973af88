"""``minitrainbench train``: the tiny GPT under tp x pp x dp x cp against one process, headless.

Prints, per step (all of a short run, a sample of a long one), the loss next to the one-process
loss, the errors against one process re-anchored on the run's own state (the verdict) and the
free-running drift, then the bytes each group sent per step (rank 0 and all ranks' total, measured
and by formula); progress lines go to stderr as steps finish. A layout whose product is not
``--world-size`` (or torchrun's world size) is bad arguments (exit 2).
"""
from __future__ import annotations

import argparse
import sys

from mtb_helpers.capstone.validate import DP_STRATEGIES, PP_SCHEDULES
from mtb_helpers.checking.command import add_command, emit_document, is_primary, save_figure

__all__ = ["register", "run_train", "loss_table"]


def _bug_help() -> str:
    from mtb_helpers.capstone.bugs import BUGS
    return "deliberate bugs (--bug NAME):\n" + "\n".join(
        f"  {name}\n      {bug.description}" for name, bug in BUGS.items())


def register(top: argparse._SubParsersAction, groups: dict[str, argparse._SubParsersAction]) -> None:
    """Add ``minitrainbench train``."""
    parser = add_command(
        top, "train", "train the tiny GPT under tp x pp x dp x cp and compare with one process",
        "Train the capstone's tiny GPT with tensor (+sequence), pipeline, data and context "
        "parallelism on tp*pp*dp*cp real gloo ranks, and compare the loss of every step and the "
        "final parameters with one process.", run_train, common=None,
        **{dim: (1, f"{dim} size (1)") for dim in ("tp", "pp", "dp", "cp")},
        world_size={"type": int, "default": None, "help": "optional: must equal tp*pp*dp*cp"},
        steps=(20, "AdamW steps (20)"), microbatches=(2, "pipeline micro-batches (2)"),
        schedule={"choices": PP_SCHEDULES, "default": "1f1b"},
        strategy={"choices": DP_STRATEGIES, "default": "ddp"},
        no_sequence_parallel=(False, "tensor parallelism without sequence parallelism"),
        dtype={"choices": ("float32", "float64"), "default": "float64"}, seed=(0, None),
        bug={"default": None, "help": "inject a deliberate bug (listed below)"},
        plot={"default": None, "metavar": "PNG", "help": "save the loss curves here"},
        timeout=(60.0, "seconds before ranks that stopped answering are reported as hung; it "
                       "guards each call of a few steps (a quarter of it at the measured pace), "
                       "not the run, so a run may be as long as it needs (60)"),
        quiet=(False, "no progress lines on stderr (steps done, loss, seconds per step)"))
    parser.epilog, parser.formatter_class = _bug_help(), argparse.RawDescriptionHelpFormatter


def print_progress(done: int, steps: int, loss: float, seconds_per_step: float) -> None:
    """One stderr line per call of steps: stdout stays the report (one JSON document with --json)."""
    print(f"[train] step {done}/{steps}  loss {loss:.6f}  {seconds_per_step:.3f} s/step",
          file=sys.stderr, flush=True)


def shown_steps(steps: int, failing: set[int], most: int = 12) -> list[int]:
    """The steps a table shows: all of a short run; else the first 3, the last, evenly spaced
    ones between, and every failing one up to ``most`` lines more."""
    if steps <= most:
        return list(range(1, steps + 1))
    picked = {1, 2, 3, steps} | {round(1 + i * (steps - 1) / (most - 4)) for i in range(most - 3)}
    return sorted(picked | set(sorted(failing)[:most]))


def loss_table(report) -> str:
    """Per step: the parallel loss, the one-process loss (free-running), the error of the loss
    and of the step against the reference re-anchored on the parallel run's own state (the
    verdict), and the free-running drift of the parameters; then the final parameters."""
    losses, drift = report.extra["losses"], report.extra["drift"]
    loss_rows = [r for r in report.rows if r.quantity == "loss"]
    step_rows = [r for r in report.rows if r.quantity == "step"]
    failing = {k for k, (a, b) in enumerate(zip(loss_rows, step_rows), 1)
               if not (a.passed and b.passed)}
    lines = ["step  parallel loss       one process (free)  loss err  step err  tolerance  ok  "
             "free drift",
             "----  ------------------  ------------------  --------  --------  ---------  --  "
             "----------"]
    shown = shown_steps(len(loss_rows), failing)
    for k in shown:
        a, b, lr, sr = losses["parallel"][k - 1], losses["reference"][k - 1], loss_rows[k - 1], \
            step_rows[k - 1]
        free = drift["free"]["params"][k - 1]
        lines.append(f"{k:4d}  {a:18.15f}  {b:18.15f}  {lr.max_abs_err:.1e}   {sr.max_abs_err:.1e}"
                     f"   {sr.tolerance:.0e}      {'yes' if k not in failing else 'NO '} "
                     f"{free if free is None else format(free, '.1e')}")
    if len(shown) < len(loss_rows):
        lines.append(f"({len(loss_rows) - len(shown)} more steps not shown; --json has them all)")
    lines.append("loss err / step err: against one process re-anchored on this run's own state "
                 "each step (errors cannot compound); free drift: the parameters' distance from "
                 "a free-running one-process run, rounding compounding through AdamW")
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

    from mtb_helpers.runtime.ranks import in_launched_job, resolve_world_size

    world = args.tp * args.pp * args.dp * args.cp
    if args.world_size is None and in_launched_job():   # inside torchrun: its size
        args.world_size = resolve_world_size(world)
    if args.world_size is not None and args.world_size != world:
        raise ValueError(f"tp*pp*dp*cp = {args.tp}*{args.pp}*{args.dp}*{args.cp} = {world} is not "
                         f"the world size {args.world_size}")
    report = check_capstone(args.tp, args.pp, args.dp, args.cp, steps=args.steps,
                            microbatches=args.microbatches, schedule=args.schedule,
                            sequence_parallel=not args.no_sequence_parallel,
                            strategy=args.strategy, seed=args.seed, dtype=args.dtype, bug=args.bug,
                            timeout=args.timeout,
                            progress=None if args.quiet or not is_primary() else print_progress)
    if args.plot:
        from mtb_helpers.capstone.plots import plot_losses
        losses = report.extra["losses"]
        save_figure(lambda: plot_losses(losses["parallel"], losses["reference"],
                                        f"tp={args.tp} pp={args.pp} dp={args.dp} cp={args.cp}"),
                    args.plot)
    return emit_document(lambda: {"passed": report.passed, "checks": [report.to_dict()]}, args.json,
                         lambda: "\n".join([report.title(), loss_table(report), bytes_table(report),
                                            "every step matches one process" if report.passed
                                            else "FAILED"]), 0 if report.passed else 1)
