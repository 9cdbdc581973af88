"""``minitrainbench dp overlap``: DDP's step time without and with overlap (and ZeRO-1, FSDP with
and without prefetch) measured on real ranks under an emulated link, next to the α-β prediction.

    minitrainbench dp overlap [--bucket-cap-mb 0.5] [--alpha 1e-3] [--bandwidth 2.5e8]
                              [--world-size 2] [--time-scale 20] [--layers 8] [--hidden 256] [--json]

First the wrappers' correctness (``check_overlap`` for ddp, zero1 and fsdp, float64), then the
table of step times (the link's seconds: padded compute, emulated communication). Exit 0 when the
checks pass, 1 when one fails; bad arguments raise ValueError before any rank starts (exit 2).
Under torchrun only the checks run (an emulated link needs the course's own rank pool).
"""
from __future__ import annotations

import argparse

from mtb_helpers.cli.common import is_primary, print_document


def register(top: argparse._SubParsersAction, groups: dict[str, argparse._SubParsersAction]) -> None:
    """Add ``overlap`` to ``minitrainbench dp``."""
    parser = groups["dp"].add_parser(
        "overlap", help="hiding communication: step time without / with overlap, predicted and measured",
        description="Check OverlappedDDP, ShardedOptimizer and FSDP against one process, then "
                    "time a step of a padded 8-layer model under an emulated link: DDP without "
                    "and with overlap, ZeRO-1, FSDP without and with prefetch, each next to its "
                    "α-β prediction. Times are the modelled link's (compute is padded).")
    parser.add_argument("--world-size", type=int, default=2, help="ranks (2)")
    parser.add_argument("--bucket-cap-mb", type=float, default=0.5,
                        help="DDP bucket cap in MiB (0.5: two layers per bucket, the predicted best here; "
                             "0.25: one layer; 0: one per parameter)")
    parser.add_argument("--alpha", type=float, default=1e-3, help="link latency, seconds (1e-3)")
    parser.add_argument("--bandwidth", type=float, default=2.5e8, help="link bandwidth, B/s (2.5e8)")
    parser.add_argument("--time-scale", type=float, default=20.0,
                        help="every modelled time stretched by this factor (20)")
    parser.add_argument("--layers", type=int, default=8, help="layers (8)")
    parser.add_argument("--hidden", type=int, default=256, help="layer width h (256)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per configuration (3)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run_overlap)


def run_overlap(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench dp overlap``; returns the exit code."""
    from mtb_helpers.cost import Link
    from mtb_helpers.dp.overlap_check import check_overlap
    from mtb_helpers.dp.overlap_time import step_table
    from mtb_helpers.runtime.ranks import in_launched_job

    link = Link(args.alpha, args.bandwidth)
    sizes = {"layers": args.layers, "hidden": args.hidden, "time_scale": args.time_scale}
    for name, v in sizes.items():
        if isinstance(v, int) and v < 1:
            raise ValueError(f"--{name} must be a positive integer, got {v}")
    reports = [check_overlap(world_size=args.world_size, wrapper=w, bucket_cap_mb=args.bucket_cap_mb)
               for w in ("ddp", "zero1", "fsdp")]
    passed = all(r.passed for r in reports)
    if in_launched_job():       # an emulated link needs the local rank pool: only the checks here
        if is_primary():
            if args.json:
                print_document({"passed": passed, "checks": {r.config["wrapper"]: r.verdict()
                                                             for r in reports}})
            else:
                print("\n".join(f"check_overlap {r.config['wrapper']}: {r.verdict()}" for r in reports)
                      + "\n(under torchrun the ranks' own network is the link: no emulated timings)")
        return 0 if passed else 1
    rows = step_table(args.world_size, link, args.bucket_cap_mb, steps=args.steps, **sizes)
    if not is_primary():
        return 0 if passed else 1
    if args.json:
        print_document({"passed": passed, "checks": {r.config["wrapper"]: r.verdict() for r in reports},
                        "label": rows[0]["label"], "unit": "seconds of the modelled link",
                        "steps": [{k: row[k] for k in ("name", "predicted", "measured")} for row in rows]})
    else:
        for r in reports:
            print(f"check_overlap {r.config['wrapper']}: {r.verdict()}")
        print(f"\nstep time, {rows[0]['label']}; {args.world_size} ranks, {args.layers} layers "
              f"of {args.hidden}x{args.hidden} (compute padded); milliseconds of the modelled link")
        print(f"  {'':20s} {'predicted':>10s} {'measured':>10s} {'gap':>7s}")
        for row in rows:
            gap = (row["measured"] - row["predicted"]) / row["predicted"]
            print(f"  {row['name']:20s} {row['predicted'] * 1e3:10.2f} {row['measured'] * 1e3:10.2f} "
                  f"{gap:+7.1%}")
        print("(times move from machine to machine; a busy machine makes measured times longer)")
    return 0 if passed else 1
