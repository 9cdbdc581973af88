"""``minitrainbench cost``: the α-β model's prediction for one collective, and this machine's
calibration, headless.

    minitrainbench cost predict --collective all-reduce --bytes 1e8 --world-size 8 \
        --alpha 5e-6 --bandwidth 50e9 [--algorithm ring] [--json]
    minitrainbench cost calibrate [--world-size 2] [--collective all-reduce ...] [--k 5] [--json]
"""
from __future__ import annotations

import argparse

from mtb_helpers.cli.common import print_document
from mtb_helpers.cost.calibrate import DEFAULT_SIZES, calibrate
from mtb_helpers.cost.model import ALGORITHMS, COLLECTIVES, Link, busbw, n_half, normalize, predict


def register(top: argparse._SubParsersAction, groups: dict[str, argparse._SubParsersAction]) -> None:
    """Add ``minitrainbench cost predict``."""
    parser = groups["cost"].add_parser(
        "predict", help="seconds one collective takes on a link of latency α and bandwidth β",
        description="Predict a collective's time with the α-β model (Thakur, Rabenseifner & "
                    "Gropp 2005); --bytes is nccl-tests' size S (all-gather: the gathered output, "
                    "reduce-scatter: the full input, all-to-all: one rank's send buffer).")
    parser.add_argument("--collective", required=True, help=f"one of {', '.join(COLLECTIVES)}")
    parser.add_argument("--bytes", required=True, type=float, dest="nbytes",
                        help="size S in bytes (1e8 accepted)")
    parser.add_argument("--world-size", required=True, type=int)
    parser.add_argument("--alpha", required=True, type=float, help="seconds per message")
    parser.add_argument("--bandwidth", required=True, type=float, help="bytes per second")
    parser.add_argument("--algorithm", default="ring",
                        help="ring (default), or another of the collective's: all-reduce "
                             "halving-doubling or naive, broadcast tree or naive, all-gather "
                             "doubling, reduce-scatter halving")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=predict_command)
    cal = groups["cost"].add_parser(
        "calibrate", help="time the collectives on this machine's ranks and fit α and β",
        description="Time each collective over log-spaced sizes (warm-up, median of k, a barrier "
                    "before each run) and fit α and β by least squares, per collective.")
    cal.add_argument("--world-size", type=int, default=2)
    cal.add_argument("--collective", action="append", choices=COLLECTIVES, default=None,
                     help="calibrate only this collective (repeatable; default: all six)")
    cal.add_argument("--sizes", default=None,
                     help=f"comma-separated sizes in bytes (default {','.join(map(str, DEFAULT_SIZES))})")
    cal.add_argument("--k", type=int, default=5, help="timed runs per size (median taken)")
    cal.add_argument("--json", action="store_true", help="print the table and fits as JSON")
    cal.set_defaults(func=calibrate_command)


def predict_command(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench cost predict``; ValueError (exit 2) on bad input."""
    link = Link(args.alpha, args.bandwidth)
    name = normalize(args.collective)
    seconds = predict(name, args.nbytes, args.world_size, link, args.algorithm)
    row = {"collective": name, "algorithm": args.algorithm, "bytes": args.nbytes,
           "world_size": args.world_size, "alpha": link.alpha, "bandwidth": link.bandwidth,
           "seconds": seconds,
           "busbw": busbw(name, args.nbytes, seconds, args.world_size) if seconds > 0 else None,
           "n_half": n_half(name, args.world_size, link, args.algorithm)
           if args.world_size > 1 else None}
    if args.json:
        print_document(row)
    else:
        others = ", ".join(a for a in ALGORITHMS[name] if a != args.algorithm)
        print(f"{name} ({args.algorithm}) of {args.nbytes:.6g} B on {args.world_size} ranks, "
              f"{link.describe()}: {seconds * 1e3:.6g} ms predicted")
        if row["n_half"] is not None:
            bound = "latency" if args.nbytes < row["n_half"] else "bandwidth"
            print(f"  n½ = {row['n_half']:.4g} B: this size is {bound}-bound; busbw "
                  f"{row['busbw'] / 1e9:.4g} GB/s" + (f"; other algorithms: {others}" if others else ""))
    return 0


def calibrate_command(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench cost calibrate``; ValueError (exit 2) on bad input."""
    try:
        sizes = None if args.sizes is None else [int(float(s)) for s in args.sizes.split(",")]
    except ValueError:
        raise ValueError(f"--sizes must be comma-separated byte counts, got {args.sizes!r}") from None
    cal = calibrate(args.world_size, sizes=sizes, collectives=args.collective, k=args.k)
    if args.json:
        print_document(cal.to_dict())
    else:
        print(f"calibrated on {cal.world_size} gloo ranks of this machine (times move from machine "
              "to machine, and with its load):")
        print(cal.table())
    return 0
