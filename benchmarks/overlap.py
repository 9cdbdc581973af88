"""Hiding communication (notebook 14): step times measured under an emulated link against the α-β
prediction, and the bucket-size curve.

    python benchmarks/overlap.py [--world-size 2] [--time-scale 30] [--steps 5]
                                 [--alpha 1e-3] [--bandwidth 2.5e8]

The padded 8-layer model of ``dp.overlap_time`` (each layer 0.5 ms forward, 2 ms backward; the
optimizer 1 ms) under the link: DDP without and with overlap (two layers per bucket), ZeRO-1,
FSDP without and with prefetch, then DDP's step against ``bucket_cap_mb``. Each measured time is
the median of ``--steps`` steps, in the link's seconds (the time scale divided out), next to the
prediction written before it; the gap is ``measured / predicted - 1`` and the issue asks for
|gap| <= 10 % on an idle machine. Prints Markdown tables for BENCHMARKS.md.
"""
import argparse
import os

from mtb_helpers import shutdown
from mtb_helpers.cost import Link
from mtb_helpers.dp.overlap_time import bucket_curve, step_table

CAPS = (0.0, 0.25, 0.5, 1.0, 2.0)   # 16, 8, 4, 2 and 1 buckets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--time-scale", type=float, default=30.0)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--alpha", type=float, default=1e-3)
    parser.add_argument("--bandwidth", type=float, default=2.5e8)
    args = parser.parse_args()
    link = Link(args.alpha, args.bandwidth)
    sizes = {"time_scale": args.time_scale}
    rows = step_table(args.world_size, link, 0.5, steps=args.steps, **sizes)
    print(f"# {rows[0]['label']}; p={args.world_size}; {os.cpu_count()} cores; median of "
          f"{args.steps} steps; load average {os.getloadavg()[0]:.1f}")
    print("| configuration | predicted (ms) | measured (ms) | gap |")
    print("|---|---|---|---|")
    for row in rows:
        gap = row["measured"] / row["predicted"] - 1
        print(f"| {row['name']} | {row['predicted'] * 1e3:.2f} | {row['measured'] * 1e3:.2f} "
              f"| {gap:+.1%}{'' if abs(gap) <= 0.10 else ' (over 10 %)'} |")
    curve = bucket_curve(CAPS, args.world_size, link, steps=args.steps, **sizes)
    print(f"\n# bucket-size curve (DDP with overlap); no overlap predicted "
          f"{curve['no_overlap'] * 1e3:.2f} ms")
    print("| bucket_cap_mb | predicted (ms) | measured (ms) | gap |")
    print("|---|---|---|---|")
    for cap, p, m in zip(curve["caps"], curve["predicted"], curve["measured"]):
        print(f"| {cap:g} | {p * 1e3:.2f} | {m * 1e3:.2f} | {m / p - 1:+.1%} |")
    shutdown()


if __name__ == "__main__":
    main()
