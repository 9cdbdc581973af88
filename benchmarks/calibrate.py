"""This machine's α and β per collective, fitted on real gloo ranks (BENCHMARKS.md, "Time:
calibration"). A benchmark, not a test: run it on an idle machine.

    python benchmarks/calibrate.py [--world-sizes 2,4] [--k 7] [--json]

For each world size: ``calibrate`` over 1 KiB .. 4 MiB (x4 apart), warm-up 2, median of ``--k``
runs each after a barrier; the table of measured and fitted times with residuals, then α, β and
n½ = α·β per collective. ``minitrainbench cost calibrate`` is the same for one world size.
"""
from __future__ import annotations

import argparse
import json

from mtb_helpers import shutdown
from mtb_helpers.cost import calibrate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = []
    try:
        for p in (int(s) for s in args.world_sizes.split(",")):
            cal = calibrate(p, k=args.k)
            out.append(cal.to_dict())
            if not args.json:
                print(f"== {p} ranks\n{cal.table()}\n", flush=True)
    finally:
        shutdown()
    if args.json:
        print(json.dumps(out, allow_nan=False))


if __name__ == "__main__":
    main()
