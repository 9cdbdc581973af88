"""``minitrainbench dp overlap``: DDP's step time without and with overlap (and ZeRO-1, FSDP with
and without prefetch) measured on real ranks under an emulated link, next to the α-β prediction.

    minitrainbench dp overlap [--bucket-cap-mb 0.5] [--alpha 1e-3] [--bandwidth 2.5e8]
                              [--world-size 2] [--time-scale 20] [--layers 8] [--hidden 256] [--json]

First the wrappers' correctness (``check_overlap`` for ddp, zero1 and fsdp, float64), then the
table of step times (the link's seconds: padded compute, emulated communication). A link or time
scale slower than a year per byte or message is bad arguments, named as typed. Under torchrun
only the checks run (an emulated link needs the course's own rank pool).
"""
from __future__ import annotations

import argparse

from mtb_helpers.checking.command import (add_command, add_world_size_option, emit_document,
                                         integer, naming, real)


def register(top: argparse._SubParsersAction, groups: dict[str, argparse._SubParsersAction]) -> None:
    """Add ``overlap`` to ``minitrainbench dp``."""
    add_command(
        groups["dp"], "overlap",
        "hiding communication: step time without / with overlap, predicted and measured",
        "Check OverlappedDDP, ShardedOptimizer and FSDP against one process, then time a step of "
        "a padded 8-layer model under an emulated link: DDP without and with overlap, ZeRO-1, "
        "FSDP without and with prefetch, each next to its α-β prediction. Times are the modelled "
        "link's (compute is padded).", run_overlap, common=add_world_size_option,
        json_help="print one JSON document",
        bucket_cap_mb={"type": real(0.0, strict=False), "default": 0.5,
                       "help": "DDP bucket cap in MiB (0.5: two layers per bucket, the predicted "
                               "best here; 0.25: one layer; 0: one per parameter)"},
        alpha={"type": real(), "default": 1e-3, "help": "link latency, seconds (1e-3)"},
        bandwidth={"type": real(), "default": 2.5e8, "help": "link bandwidth, B/s (2.5e8)"},
        time_scale={"type": real(), "default": 20.0,
                    "help": "every modelled time stretched by this factor (20)"},
        layers={"type": integer(1), "default": 8, "help": "layers (8)"},
        hidden={"type": integer(1), "default": 256, "help": "layer width h (256)"},
        steps={"type": integer(1), "default": 3, "help": "timed steps per configuration (3)"})


def run_overlap(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench dp overlap``; returns the exit code."""
    from mtb_helpers.cost import Link
    from mtb_helpers.dp.overlap_check import check_overlap
    from mtb_helpers.dp.overlap_time import step_table
    from mtb_helpers.runtime.link import validate_link
    from mtb_helpers.runtime.ranks import in_launched_job, resolve_world_size

    with naming(args, "--alpha", "--bandwidth", "--time-scale"):   # all before any rank starts
        link = Link(args.alpha, args.bandwidth)
        validate_link(link, args.time_scale)
    with naming(args, "--world-size"):
        resolve_world_size(args.world_size)
    sizes = {"layers": args.layers, "hidden": args.hidden, "time_scale": args.time_scale}
    reports = [check_overlap(world_size=args.world_size, wrapper=w, bucket_cap_mb=args.bucket_cap_mb)
               for w in ("ddp", "zero1", "fsdp")]
    passed = all(r.passed for r in reports)
    checks = {r.config["wrapper"]: r.verdict() for r in reports}
    verdicts = "\n".join(f"check_overlap {w}: {v}" for w, v in checks.items())
    if in_launched_job():       # an emulated link needs the local rank pool: only the checks here
        return emit_document(lambda: {"passed": passed, "checks": checks}, args.json, lambda: (
            verdicts + "\n(under torchrun the ranks' own network is the link: no emulated timings)"),
            0 if passed else 1)
    rows = step_table(args.world_size, link, args.bucket_cap_mb, steps=args.steps, **sizes)

    def text() -> str:
        lines = [verdicts, "", f"step time, {rows[0]['label']}; {args.world_size} ranks, "
                 f"{args.layers} layers of {args.hidden}x{args.hidden} (compute padded); "
                 "milliseconds of the modelled link",
                 f"  {'':20s} {'predicted':>10s} {'measured':>10s} {'gap':>7s}"]
        for row in rows:
            gap = (row["measured"] - row["predicted"]) / row["predicted"]
            lines.append(f"  {row['name']:20s} {row['predicted'] * 1e3:10.2f} "
                         f"{row['measured'] * 1e3:10.2f} {gap:+7.1%}")
        lines.append("(times move from machine to machine; a busy machine makes measured times longer)")
        return "\n".join(lines)
    return emit_document(lambda: {
        "passed": passed, "checks": checks, "label": rows[0]["label"],
        "unit": "seconds of the modelled link",
        "steps": [{k: row[k] for k in ("name", "predicted", "measured")} for row in rows]},
        args.json, text, 0 if passed else 1)
