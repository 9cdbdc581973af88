"""``minitrainbench moe check``: the expert-parallel check, headless.

Prints the report table, then the routing in numbers (choices per expert, dropped) and the bytes
each rank sent in each all-to-all next to the all-gather alternative; or with ``--json``
``{"passed": ..., "checks": [report.to_dict()]}`` (the dict carries ``"moe"``). Exit status and
torchrun as every check command (``checking/command.py``).
"""
from __future__ import annotations

import argparse

from mtb_helpers.checking.command import add_check_options, emit


def _capacity(text: str) -> float | None:
    return None if text.lower() == "none" else float(text)


def register(top: argparse._SubParsersAction,
             groups: dict[str, argparse._SubParsersAction]) -> None:
    """Add ``check`` to ``minitrainbench moe``."""
    parser = groups["moe"].add_parser(
        "check", help="expert-parallel MoE (all-to-all dispatch and combine) against one process",
        description="Run the expert-parallel MoE layer (replicated router, experts spread over "
                    "the ranks, tokens dispatched and combined with all-to-all) on real gloo "
                    "ranks and compare output, input grad, router grad and every expert's grads "
                    "with the single-process MoE; then print the bytes of each all-to-all.")
    add_check_options(parser)
    parser.add_argument("--experts", type=int, default=4,
                        help="number of experts E, divisible by the world size (4)")
    parser.add_argument("--top-k", type=int, default=1, help="experts per token (1)")
    parser.add_argument("--tokens", type=int, default=16,
                        help="tokens n, divisible by the world size (16)")
    parser.add_argument("--hidden", type=int, default=8, help="model width h (8)")
    parser.add_argument("--ffn-hidden", type=int, default=16, help="expert MLP width (16)")
    parser.add_argument("--capacity-factor", type=_capacity, default=None,
                        help="capacity factor c > 0, or none for no limit (none)")
    parser.set_defaults(func=run_check)


def run_check(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench moe check``; returns the exit code."""
    from mtb_helpers.moe.check import check_moe

    report = check_moe(world_size=args.world_size, num_experts=args.experts, top_k=args.top_k,
                       tokens=args.tokens, hidden=args.hidden, ffn_hidden=args.ffn_hidden,
                       capacity_factor=args.capacity_factor, dtype=args.dtype, seed=args.seed,
                       bug=args.bug)
    return emit([report], args.json, _routing)


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
