"""Time of the notebook-10 checks at 4 ranks (BENCHMARKS.md, "Attention and vocabulary checks").

    python benchmarks/attention_vocab_checks.py [--world-size 4] [--repeats 10]

For each check and dtype: the first call in this interpreter (it starts the 4-rank pool, so it
includes the cold start) and the median / min of ``--repeats`` further calls on the warm pool
(what a notebook cell or an explorer slider waits for). Default shapes, as in the CLI.
"""
from __future__ import annotations

import argparse
import statistics

from mtb_helpers import shutdown
from mtb_helpers.check import check_tp_attention, check_vocab_parallel
from timing import timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    t = args.world_size
    checks = {
        "check_tp_attention (s=4, b=2, 4 heads of 4)": lambda dtype: check_tp_attention(
            world_size=t, dtype=dtype),
        "check_vocab_parallel (V=12, h=4, 4x2 tokens)": lambda dtype: check_vocab_parallel(
            world_size=t, dtype=dtype),
    }
    print("| check | dtype | first call (pool start) | warm median | warm min |")
    print("|---|---|---:|---:|---:|")
    for name, check in checks.items():
        for dtype in ("float32", "float64"):
            first = timed(lambda: check(dtype))
            warm = [timed(lambda: check(dtype)) for _ in range(args.repeats)]
            print(f"| {name} | {dtype} | {first * 1e3:.0f} ms | "
                  f"{statistics.median(warm) * 1e3:.0f} ms | {min(warm) * 1e3:.0f} ms |")
        shutdown()   # the next check's first call starts its own pool again
    print(f"\n{t} ranks, {args.repeats} warm calls each")


if __name__ == "__main__":
    main()
