"""Time of the notebook-11 checks at 4 ranks (BENCHMARKS.md, "Context-parallel checks").

    python benchmarks/cp_checks.py [--world-size 4] [--repeats 10] [--seq 16 256]

For each variant (ring, all-gather), layout (contiguous, zigzag), mask and sequence length: the
median and min of ``--repeats`` calls of ``check_context_parallel`` on the warm pool (what a
notebook cell or an explorer slider waits for), float64, 2 heads of 4. The first call of the run
(it starts the pool, so it includes the cold start) is printed once, before the table.
"""
from __future__ import annotations

import argparse
import statistics

from mtb_helpers.check import check_context_parallel
from timing import timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--seq", type=int, nargs="+", default=[16, 256])
    args = parser.parse_args()
    t = args.world_size
    first = timed(lambda: check_context_parallel(dtype="float64", world_size=t,
                                                 seq=args.seq[0]))
    print(f"first call (starts the {t}-rank pool): {first * 1e3:.0f} ms\n")
    print("| variant | layout | mask | s | warm median | warm min |")
    print("|---|---|---|---:|---:|---:|")
    for seq in args.seq:
        for variant in ("ring", "allgather"):
            for layout in ("contiguous", "zigzag"):
                for causal in (False, True):
                    config = dict(dtype="float64", world_size=t, seq=seq, variant=variant,
                                  layout=layout, causal=causal)
                    runs = [timed(lambda: check_context_parallel(**config))
                            for _ in range(args.repeats)]
                    print(f"| {variant} | {layout} | {'causal' if causal else 'none'} | {seq} | "
                          f"{statistics.median(runs) * 1e3:.0f} ms | {min(runs) * 1e3:.0f} ms |")
    print(f"\n{t} ranks, {args.repeats} warm calls each, float64, b=1, 2 heads, d=4")


if __name__ == "__main__":
    main()
