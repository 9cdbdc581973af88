"""The pipeline on real ranks against the simulator: measured bubble and peak stash per schedule.

    python benchmarks/pp_bubble.py [--forward 0.2] [--backward 0.4] [--repeats 3]

p = 4 ranks, m = 8 micro-batches (interleaved: v = 2 chunks). Every op is padded to fixed times
(``op_time``: F and B seconds per micro-batch on a whole stage, zb-h1's I = W = B/2), so the
timeline shows the schedule and not this machine's cores. For each schedule: the median measured
bubble fraction over ``--repeats`` steps next to ``simulate()`` with the same op times, their
relative gap, peak_stashed against the simulator's peak_activations, and the bytes held with and
without recompute. Prints a Markdown table for BENCHMARKS.md.
"""
import argparse
import os
import statistics

from mtb_helpers import shutdown
from mtb_helpers.pp.check import check_pipeline

SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forward", type=float, default=0.2)
    parser.add_argument("--backward", type=float, default=0.4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    op_time = (args.forward, args.backward)
    print(f"# p=4, m=8, op_time F={args.forward} s, B={args.backward} s; {os.cpu_count()} cores; "
          f"median of {args.repeats} steps; load average {os.getloadavg()[0]:.1f}")
    print("| schedule | measured bubble | simulated | gap (relative) | peak_stashed | simulator "
          "| bytes held peak | with recompute | recompute makespan / plain |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, chunks in SCHEDULES:
        runs = [check_pipeline(name, 4, 8, chunks, op_time=op_time) for _ in range(args.repeats)]
        assert all(r.passed for r in runs), name
        pipe = [r.extra["pipeline"] for r in runs]
        measured = statistics.median(p["measured_bubble_fraction"] for p in pipe)
        simulated = pipe[0]["simulated_bubble_fraction"]
        rec = check_pipeline(name, 4, 8, chunks, op_time=op_time, recompute=True)
        assert rec.passed, name
        span = statistics.median(p["makespan_s"] for p in pipe)
        print(f"| {name} | {measured:.3f} | {simulated:.3f} | {(measured - simulated) / simulated:+.1%} "
              f"| {pipe[0]['peak_stashed']} | {pipe[0]['simulated_peak_activations']} "
              f"| {pipe[0]['stash_bytes']} | {rec.extra['pipeline']['stash_bytes']} "
              f"| {rec.extra['pipeline']['makespan_s'] / span:.2f} |")
    shutdown()


if __name__ == "__main__":
    main()
