"""``minitrainbench pp bubble``: a pipeline schedule's op order, makespan, bubble and peak memory.

Pure simulation: no ranks start. Exit 0 on success, 2 on bad arguments (a ValueError from
``schedule``/``simulate`` escapes the handler and the top-level command turns it into 2).
"""
from __future__ import annotations

import argparse
import json
import math

from mtb_helpers.cli.common import is_primary
from mtb_helpers.pp.schedules import SCHEDULES, closed_form, schedule, simulate


def register(top: argparse._SubParsersAction, groups: dict[str, argparse._SubParsersAction]) -> None:
    """Add ``bubble`` to ``minitrainbench pp``."""
    parser = groups["pp"].add_parser(
        "bubble", help="simulate a pipeline schedule: op order, bubble, peak activations",
        description="Simulate a pipeline schedule on uniform stages and print each stage's op "
                    "order, the makespan, the bubble fraction next to its closed form, and the "
                    "peak activations per stage. No ranks start.")
    parser.add_argument("--schedule", choices=tuple(SCHEDULES), default="1f1b")
    parser.add_argument("--stages", type=int, default=4, help="pipeline stages p (one per rank)")
    parser.add_argument("--microbatches", type=int, default=8, help="micro-batches m")
    parser.add_argument("--chunks", type=int, default=None,
                        help="model chunks per rank v (interleaved only; default 2)")
    parser.add_argument("--forward", type=float, default=1.0,
                        help="forward time of one micro-batch on one whole stage")
    parser.add_argument("--backward", type=float, default=2.0,
                        help="backward time (zb-h1 splits it evenly into I and W)")
    parser.add_argument("--input", type=float, default=None, help="zb-h1: input-grad time I")
    parser.add_argument("--weight", type=float, default=None, help="zb-h1: weight-grad time W")
    parser.add_argument("--latency", type=float, default=0.0,
                        help="point-to-point latency added to every cross-stage dependency")
    parser.add_argument("--plot", metavar="OUT.png", default=None, help="write the Gantt chart")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=bubble)


# What a Gantt chart can still show (and the simulator builds in well under a second).
MAX_BUBBLE_STAGES = 32
MAX_BUBBLE_MICROBATCHES = 256
MAX_BUBBLE_CHUNKS = 16
MAX_BUBBLE_OPS = 1024  # stages x microbatches x chunks: forward ops in the whole chart


def check_bubble_args(args: argparse.Namespace) -> None:
    """Refuse sizes no figure can show and times that are not positive, finite numbers."""
    chunks = args.chunks or (2 if args.schedule == "interleaved" else 1)
    for flag, value, limit in (("--stages", args.stages, MAX_BUBBLE_STAGES),
                               ("--microbatches", args.microbatches, MAX_BUBBLE_MICROBATCHES),
                               ("--chunks", chunks, MAX_BUBBLE_CHUNKS)):
        if value > limit:
            raise ValueError(f"{flag} {value} is more than a pipeline chart can show (at most "
                             f"{limit})")
    if args.stages * args.microbatches * chunks > MAX_BUBBLE_OPS:
        raise ValueError(f"--stages {args.stages} x --microbatches {args.microbatches} x "
                         f"chunks {chunks} is more ops than a pipeline chart can show (at most "
                         f"{MAX_BUBBLE_OPS})")
    for flag, value in (("--forward", args.forward), ("--backward", args.backward),
                        ("--input", args.input), ("--weight", args.weight)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"{flag} {value:g} must be a positive, finite time")
    if not (math.isfinite(args.latency) and args.latency >= 0):
        raise ValueError(f"--latency {args.latency:g} must be a finite time >= 0")


def bubble(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench pp bubble``; returns the exit code."""
    check_bubble_args(args)
    if args.schedule != "zb-h1" and (args.input is not None or args.weight is not None):
        raise ValueError("--input/--weight only apply to zb-h1, which splits the backward")
    ops = schedule(args.schedule, args.stages, args.microbatches, args.chunks)
    timeline = simulate(ops, args.forward, args.backward, input=args.input, weight=args.weight,
                        latency=args.latency)
    ref = closed_form(args.schedule, ops.stages, ops.microbatches, ops.chunks, args.forward,
                      args.backward, args.input, args.weight)
    if not is_primary():  # under torchrun every rank would compute the same: rank 0 reports
        return 0
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")  # headless: never open a window from the command line
        import matplotlib.pyplot as plt

        from mtb_helpers.pp.plots import plot_gantt
        fig = plot_gantt(timeline, args.schedule)
        fig.savefig(args.plot, dpi=100, bbox_inches="tight")
        plt.close(fig)
    wide = ops.chunks > 1
    if args.json:
        print(json.dumps({"schedule": args.schedule, "stages": ops.stages,
                          "microbatches": ops.microbatches, "chunks": ops.chunks,
                          "ops": [" ".join(op.label(wide) for op in stage) for stage in ops],
                          **timeline.to_dict(), "closed_form": ref, "plot": args.plot},
                         indent=2))
        return 0
    print(f"schedule {args.schedule}: p={ops.stages} stages, m={ops.microbatches} micro-batches"
          + (f", v={ops.chunks} chunks per rank" if wide else ""))
    print(ops.table())
    print(f"makespan          {timeline.makespan:g}")
    print(f"bubble fraction   {timeline.bubble_fraction:.4f}  idle / (p x makespan); closed form "
          f"{ref['bubble_fraction']:.4f} ({ref['source']})")
    print(f"bubble ratio      {timeline.bubble_ratio:.4f}  idle / busy; closed form "
          f"{ref['bubble_ratio']:.4f}")
    peaks = " ".join(str(a) for a in timeline.peak_activations)
    print(f"peak activations  {peaks}  (stage 0..{ops.stages - 1}; "
          + ("chunk activations, 1/v of a stage's each)" if wide else "micro-batches in flight)"))
    if args.plot:
        print(f"wrote {args.plot}")
    return 0
