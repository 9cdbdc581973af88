"""``minitrainbench cost``: the α-β model's prediction for one collective, and this machine's
calibration, headless.

    minitrainbench cost predict --collective all-reduce --bytes 1e8 --world-size 8 \
        --alpha 5e-6 --bandwidth 50e9 [--algorithm ring] [--json]
    minitrainbench cost calibrate [--world-size 2] [--collective all-reduce ...] [--k 5] [--json]

Bad input (a number out of range, a link slower than a year per byte or message, a time that
overflows, sizes that round to fewer than two measurements) exits 2 before any rank starts, with
one line naming the options as typed.
"""
from __future__ import annotations

import argparse

from mtb_helpers.checking.command import (add_command, add_world_size_option, emit_document,
                                         integer, naming, real)
from mtb_helpers.cost.calibrate import DEFAULT_SIZES, calibrate
from mtb_helpers.cost.model import ALGORITHMS, COLLECTIVES, Link, busbw, n_half, normalize, predict


def byte_sizes(text: str) -> list[int]:
    """An argparse ``type``: comma-separated byte counts ("1024,1e6"), each a whole number."""
    sizes = []
    for word in text.split(","):
        try:
            sizes.append(integer(0)(word.strip()))
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"{word.strip()!r} in {text!r} is not a whole "
                                             "number of bytes") from None
    return sizes


def register(top: argparse._SubParsersAction, groups: dict[str, argparse._SubParsersAction]) -> None:
    """Add ``minitrainbench cost predict`` and ``minitrainbench cost calibrate``."""
    add_command(
        groups["cost"], "predict",
        "seconds one collective takes on a link of latency α and bandwidth β",
        "Predict a collective's time with the α-β model (Thakur, Rabenseifner & Gropp 2005); "
        "--bytes is nccl-tests' size S (all-gather: the gathered output, reduce-scatter: the full "
        "input, all-to-all: one rank's send buffer).", predict_command, common=None,
        json_help="print one JSON document",
        collective={"required": True, "help": f"one of {', '.join(COLLECTIVES)}"},
        bytes={"required": True, "type": real(0.0, strict=False),
               "help": "size S in bytes (1e8 accepted)"},
        world_size={"required": True, "type": integer(1),
                    "help": "ranks p of the modelled collective (any number: nothing runs)"},
        alpha={"required": True, "type": real(), "help": "seconds per message"},
        bandwidth={"required": True, "type": real(), "help": "bytes per second"},
        algorithm=("ring", "ring (default), or another of the collective's: all-reduce "
                           "halving-doubling or naive, broadcast tree or naive, all-gather "
                           "doubling, reduce-scatter halving"))
    add_command(
        groups["cost"], "calibrate", "time the collectives on this machine's ranks and fit α and β",
        "Time each collective over log-spaced sizes (warm-up, median of k, a barrier before each "
        "run) and fit α and β by least squares, per collective.", calibrate_command,
        common=add_world_size_option, json_help="print the table and fits as JSON",
        collective={"action": "append", "choices": COLLECTIVES, "default": None,
                    "help": "calibrate only this collective (repeatable; default: all six)"},
        sizes={"default": None, "type": byte_sizes, "help": "comma-separated sizes in bytes "
               f"(default {','.join(map(str, DEFAULT_SIZES))})"},
        k={"type": integer(1), "default": 5, "help": "timed runs per size (median taken)"})


def predict_command(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench cost predict``; ValueError (exit 2) on bad input."""
    with naming(args, "--alpha", "--bandwidth"):
        link = Link(args.alpha, args.bandwidth)
    with naming(args, "--collective", "--algorithm", "--bytes", "--world-size"):
        name = normalize(args.collective)
        seconds = predict(name, args.bytes, args.world_size, link, args.algorithm)
    row = {"collective": name, "algorithm": args.algorithm, "bytes": args.bytes,
           "world_size": args.world_size, "alpha": link.alpha, "bandwidth": link.bandwidth,
           "seconds": seconds,
           "busbw": busbw(name, args.bytes, seconds, args.world_size) if seconds > 0 else None,
           "n_half": n_half(name, args.world_size, link, args.algorithm)
           if args.world_size > 1 else None}

    def text() -> str:
        others = ", ".join(a for a in ALGORITHMS[name] if a != args.algorithm)
        lines = [f"{name} ({args.algorithm}) of {args.bytes:.6g} B on {args.world_size} ranks, "
                 f"{link.describe()}: {seconds * 1e3:.6g} ms predicted"]
        if row["n_half"] is not None:
            bound = "latency" if args.bytes < row["n_half"] else "bandwidth"
            lines.append(f"  n½ = {row['n_half']:.4g} B: this size is {bound}-bound; busbw "
                         f"{row['busbw'] / 1e9:.4g} GB/s"
                         + (f"; other algorithms: {others}" if others else ""))
        return "\n".join(lines)
    return emit_document(lambda: row, args.json, text)


def calibrate_command(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench cost calibrate``; ValueError (exit 2) on bad input."""
    with naming(args, "--world-size", "--sizes"):
        cal = calibrate(args.world_size, sizes=args.sizes, collectives=args.collective, k=args.k)
    return emit_document(cal.to_dict, args.json, lambda: (
        f"calibrated on {cal.world_size} gloo ranks of this machine (times move from machine "
        f"to machine, and with its load):\n{cal.table()}"))
