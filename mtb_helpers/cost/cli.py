"""``minitrainbench cost``: the α-β model's prediction for one collective, headless.

    minitrainbench cost predict --collective all-reduce --bytes 1e8 --world-size 8 \
        --alpha 5e-6 --bandwidth 50e9 [--algorithm ring] [--json]
"""
from __future__ import annotations

import argparse
import json

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
                        help="ring (default), tree or naive where the collective has them")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=predict_command)


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
        print(json.dumps(row, allow_nan=False))
    else:
        others = ", ".join(a for a in ALGORITHMS[name] if a != args.algorithm)
        print(f"{name} ({args.algorithm}) of {args.nbytes:.6g} B on {args.world_size} ranks, "
              f"{link.describe()}: {seconds * 1e3:.6g} ms predicted")
        if row["n_half"] is not None:
            bound = "latency" if args.nbytes < row["n_half"] else "bandwidth"
            print(f"  n½ = {row['n_half']:.4g} B: this size is {bound}-bound; busbw "
                  f"{row['busbw'] / 1e9:.4g} GB/s" + (f"; other algorithms: {others}" if others else ""))
    return 0
