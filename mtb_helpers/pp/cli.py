"""``minitrainbench pp bubble`` (simulated) and ``pp run`` (one step on real ranks, checked).

``bubble`` is pure simulation: no ranks start; it prints a schedule's op order, makespan, bubble
and peak memory. ``run`` checks ``pipeline_step`` against one process (a hung step is a failed
check)."""
from __future__ import annotations

import argparse
import math

from mtb_helpers.checking.command import (add_command, emit, emit_document, failure_document,
                                         naming, save_figure)
from mtb_helpers.checking.bug import names_for
from mtb_helpers.pp.bugs import BUGS
from mtb_helpers.pp.schedules import SCHEDULES, closed_form, schedule, simulate

PIPELINE_BUGS = names_for(BUGS, "pipeline")   # listed in --bug's help as the registry holds them


def _schedule_options(stages_help: str) -> dict:
    """--schedule, --stages, --microbatches, --chunks: what both commands run."""
    return {"schedule": {"choices": tuple(SCHEDULES), "default": "1f1b"},
            "stages": (4, stages_help), "microbatches": (8, "micro-batches m"),
            "chunks": {"type": int, "default": None,
                       "help": "model chunks per rank v (interleaved only; default 2)"}}


def register(top: argparse._SubParsersAction, groups: dict[str, argparse._SubParsersAction]) -> None:
    """Add ``bubble`` (simulated) and ``run`` (on real ranks) to ``minitrainbench pp``."""
    time = {"type": float, "default": None}
    add_command(
        groups["pp"], "bubble", "simulate a pipeline schedule: op order, bubble, peak activations",
        "Simulate a pipeline schedule on uniform stages and print each stage's op order, the "
        "makespan, the bubble fraction next to its closed form, and the peak activations per "
        "stage. No ranks start.", bubble, common=None, json_help="print the result as JSON",
        **_schedule_options("pipeline stages p (one per rank)"),
        forward=(1.0, "forward time of one micro-batch on one whole stage"),
        backward=(2.0, "backward time (zb-h1 splits it evenly into I and W)"),
        input=dict(time, help="zb-h1: input-grad time I"),
        weight=dict(time, help="zb-h1: weight-grad time W"),
        latency=(0.0, "point-to-point latency added to every cross-stage dependency"),
        plot={"metavar": "OUT.png", "default": None, "help": "write the Gantt chart"})
    add_command(
        groups["pp"], "run",
        "run one pipeline step on real gloo ranks and check it against one process",
        "Run one training step of a small Linear/GELU model as a pipeline on --stages gloo ranks "
        "(or the torchrun job's ranks), check the loss and every grad against one process, and "
        "print the measured bubble next to the simulated one. Exit 0 pass, 1 a check failed (or "
        "the step hung), 2 bad arguments.", run_pipeline, common=None,
        **_schedule_options("pipeline stages p = ranks (under torchrun: the job's ranks)"),
        op_time={"default": None, "metavar": "F,B",
                 "help": "pad every op to fixed seconds per micro-batch and stage, F,B or F,I,W "
                         "(e.g. 0.02,0.04), so the timeline shows the schedule rather than this "
                         "machine's cores"},
        recompute=(False, "keep only stage inputs and re-run the forward in backward"),
        dtype={"choices": ("float32", "float64"), "default": "float32"}, seed=(0, None),
        bug={"default": None, "help": f"inject a deliberate pipeline bug ({', '.join(PIPELINE_BUGS)}); "
             "the check must then fail"},
        timeout=(60.0, "seconds before a hung step is reported (default 60)"),
        plot={"metavar": "OUT.png", "default": None,
              "help": "write the measured Gantt chart beside the simulated one"})


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
    if args.plot:
        from mtb_helpers.pp.plots import plot_gantt
        save_figure(lambda: plot_gantt(timeline, args.schedule), args.plot)
    wide = ops.chunks > 1

    def text() -> str:
        peaks = " ".join(str(a) for a in timeline.peak_activations)
        return "\n".join([
            f"schedule {args.schedule}: p={ops.stages} stages, m={ops.microbatches} micro-batches"
            + (f", v={ops.chunks} chunks per rank" if wide else ""),
            ops.table(),
            f"makespan          {timeline.makespan:g}",
            f"bubble fraction   {timeline.bubble_fraction:.4f}  idle / (p x makespan); closed form "
            f"{ref['bubble_fraction']:.4f} ({ref['source']})",
            f"bubble ratio      {timeline.bubble_ratio:.4f}  idle / busy; closed form "
            f"{ref['bubble_ratio']:.4f}",
            f"peak activations  {peaks}  (stage 0..{ops.stages - 1}; "
            + ("chunk activations, 1/v of a stage's each)" if wide else "micro-batches in flight)"),
            *([f"wrote {args.plot}"] if args.plot else [])])
    return emit_document(lambda: {
        "schedule": args.schedule, "stages": ops.stages, "microbatches": ops.microbatches,
        "chunks": ops.chunks, "ops": [" ".join(op.label(wide) for op in stage) for stage in ops],
        **timeline.to_dict(), "closed_form": ref, "plot": args.plot}, args.json, text)


def run_pipeline(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench pp run``; returns the exit code."""
    from mtb_helpers.pp.check import check_pipeline
    from mtb_helpers.pp.runtime import op_durations
    from mtb_helpers.runtime.errors import RankTimeoutError

    with naming(args, "--op-time"):   # "0.02,0.04" -> (0.02, 0.04), refused as op_time would be
        op_time = None if args.op_time is None else tuple(float(t) for t in args.op_time.split(","))
        op_durations(op_time, 1, args.recompute)
    try:
        report = check_pipeline(args.schedule, args.stages, args.microbatches, args.chunks,
                                args.dtype, args.seed, args.bug, args.recompute, op_time,
                                timeout=args.timeout)
    except RankTimeoutError as exc:   # a deadlock (e.g. --bug pp-blocking-send): a failed check
        hung = failure_document(exc, "the pipeline step hung")
        return emit_document(lambda: hung, args.json,
                             lambda: f"FAILED: the pipeline step hung\n{hung['error']['message']}", 1)
    pipe = report.extra["pipeline"]
    if args.plot:
        from mtb_helpers.pp.measured_plots import plot_measured_vs_simulated
        from mtb_helpers.pp.runtime import simulated_for
        cfg = report.config
        sim = simulated_for(cfg["schedule"], cfg["stages"], cfg["microbatches"], cfg["chunks"],
                            op_time, cfg["recompute"])
        save_figure(lambda: plot_measured_vs_simulated(report.result.measured(), sim, cfg["schedule"],
                                                       unit="s" if op_time else "units"), args.plot)

    def details(report) -> str:
        units = "seconds" if op_time else "units of F=1, B=2 (no --op-time: real compute is measured)"
        return "\n".join([
            f"ops executed = schedule(): {'yes' if pipe['ops_match_schedule'] else 'NO'}",
            f"bubble fraction   measured {pipe['measured_bubble_fraction']:.3f}   simulated "
            f"{pipe['simulated_bubble_fraction']:.3f} ({units})",
            f"peak stashed      measured {pipe['peak_stashed']}   simulated "
            f"{pipe['simulated_peak_activations']}",
            f"stash bytes peak  {pipe['stash_bytes']}"
            + ("  (recompute: stage inputs only)" if args.recompute else ""),
            *([f"wrote {args.plot}"] if args.plot else [])])
    return emit([report], args.json, details)

