"""``minitrainbench dp check``: DDP, ZeRO-1, ZeRO-2 and ZeRO-3 against one process, step by step, headless.

Per strategy: the report table (params after the step, grads, Adam's m and v, per rank), the bytes
each rank holds (measured vs our fp32 accounting and the ZeRO paper's mixed-precision one) and the
bytes it sent (``--json``: each report's dict carries ``"memory"`` and ``"communication"``).
``--strategy all`` (the default) runs the four; a ``--bug`` goes to the strategies it applies to.
"""
from __future__ import annotations

import argparse

from mtb_helpers.checking.command import add_command, check_args, emit, own_options
from mtb_helpers.dp.check import check_all_strategies
from mtb_helpers.dp.strategies import STRATEGIES


def register(top: argparse._SubParsersAction, groups: dict[str, argparse._SubParsersAction]) -> None:
    """Add ``check`` to ``minitrainbench dp``."""
    add_command(
        groups["dp"], "check", "DDP / ZeRO-1 / ZeRO-2 / ZeRO-3: Adam steps against one process",
        "Run --steps Adam steps (3) of a small MLP with data parallelism (DDP, ZeRO-1, ZeRO-2, "
        "ZeRO-3/FSDP) on real gloo ranks, each rank on its slice of the batch, and compare "
        "parameters, gradients and Adam's state on every rank after every step with the "
        "single-process steps on the whole batch; then print the bytes each rank holds and sends "
        "next to the ZeRO paper's accounting.", run_check,
        strategy={"choices": ("all", *STRATEGIES), "default": "all",
                  "help": "which strategy to check (default: all four)"},
        batch=(8, "global batch B, split over ranks (8)"), hidden=(8, "model width h (8)"),
        ffn_hidden=(32, "MLP width f (32)"), lr=(1e-2, "Adam learning rate (0.01)"),
        weight_decay=(0.0, "Adam L2 weight decay (0)"),
        steps=(3, "training steps, each compared with one process (3: one step cannot show "
                  "gradients that are never cleared)"))
    from mtb_helpers.dp.overlap_cli import register as register_overlap
    register_overlap(top, groups)                 # minitrainbench dp overlap (notebook 14)


def figures_text(report) -> str:
    """Two lines: bytes held per rank (measured / ours / paper) and bytes sent per rank."""
    mem, comm = report.extra["memory"], report.extra["communication"]
    held = " | ".join(f"rank {r}: " + " + ".join(f"{h[k]}" for k in ("params", "grads", "optimizer_state"))
                      for r, h in enumerate(mem["per_rank"]))
    ours = " + ".join(str(v) for v in mem["ours"].values())
    paper = " + ".join(str(v) for v in mem["paper_mixed_precision"].values())
    sent = ", ".join(str(c["total"]) for c in comm["per_rank"])
    return (f"  held (params + grads + Adam state) B: {held}; ours {ours}; "
            f"ZeRO paper 2Ψ+2Ψ+12Ψ: {paper} (Ψ={mem['numel']})\n"
            f"  sent per rank B: {sent}; formula {comm['formula_text']} = {comm['formula']}")


def run_check(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench dp check``; returns the exit code."""
    own = own_options(args)
    strategy = own.pop("strategy")
    reports = check_all_strategies(**check_args(args), **own,
                                   strategies=STRATEGIES if strategy == "all" else (strategy,))
    failed = [r.config["strategy"] for r in reports if not r.passed]
    return emit(reports, args.json, figures_text,
                "FAILED: " + ", ".join(failed) if failed else "all passed")
