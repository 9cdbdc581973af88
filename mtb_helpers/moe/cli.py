"""``minitrainbench moe check``: the expert-parallel check, headless: the report, then the
routing in numbers (choices per expert, dropped) and the bytes each rank sent in each all-to-all
next to the all-gather alternative (``--json``: the report's dict, which carries ``"moe"``)."""
from __future__ import annotations

import argparse

from mtb_helpers.checking.command import add_command, check_command
from mtb_helpers.moe.check import check_moe


def _capacity(text: str) -> float | None:
    return None if text.lower() == "none" else float(text)


def register(top: argparse._SubParsersAction,
             groups: dict[str, argparse._SubParsersAction]) -> None:
    """Add ``check`` to ``minitrainbench moe``."""
    add_command(
        groups["moe"], "check",
        "expert-parallel MoE (all-to-all dispatch and combine) against one process",
        "Run the expert-parallel MoE layer (replicated router, experts spread over the ranks, "
        "tokens dispatched and combined with all-to-all) on real gloo ranks and compare output, "
        "input grad, router grad and every expert's grads with the single-process MoE; then print "
        "the bytes of each all-to-all.", check_command(check_moe, _routing, experts="num_experts"),
        experts=(4, "number of experts E, divisible by the world size (4)"),
        top_k=(1, "experts per token (1)"),
        tokens=(16, "tokens n, divisible by the world size (16)"),
        hidden=(8, "model width h (8)"), ffn_hidden=(16, "expert MLP width (16)"),
        capacity_factor={"type": _capacity, "default": None,
                         "help": "capacity factor c > 0, or none for no limit (none)"})


def _routing(report) -> str:
    moe = report.extra["moe"]
    per_expert = [sum(c[e] for c in moe["tokens_per_expert"]) for e in range(len(moe["owner"]))]
    sent = "; ".join(f"rank {r}: counts {moe['bytes']['counts'][r]}, dispatch "
                     f"{moe['bytes']['dispatch'][r]}, combine {moe['bytes']['combine'][r]}"
                     for r in range(len(moe["dispatch_rows"])))
    return (f"\ncapacity per expert per rank: {moe['capacity'] or 'unlimited'}; choices kept per "
            f"expert: {per_expert}; dropped: {moe['dropped_per_expert']}\n"
            f"bytes sent per rank (forward): {sent}\n"
            f"all-gather + reduce-scatter instead: {moe['bytes']['all_gather_alternative'][0]} B "
            f"per rank")
