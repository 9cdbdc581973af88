"""How long the capstone's (tp, pp, dp) = (2, 2, 2) run of 20 AdamW steps takes on this machine.

    python benchmarks/capstone_train.py [--steps 20] [--repeats 2]

Times ``minitrainbench train --tp 2 --pp 2 --dp 2 --steps 20`` end to end as a user runs it in a
fresh interpreter (rank start-up, 8 gloo ranks, the single-process reference, the comparison),
and, inside one interpreter, a cold and a warm call of ``check_capstone`` (the warm one reuses
the 8 ranks, as a notebook does). Prints one line per measurement.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    cmd = [sys.executable, "-m", "mtb_helpers.cli", "train", "--tp", "2", "--pp", "2", "--dp", "2",
           "--steps", str(args.steps)]
    for i in range(args.repeats):
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        print(f"CLI, fresh interpreter, run {i + 1}: {time.perf_counter() - start:.1f} s, "
              f"exit {done.returncode}: {done.stdout.strip().splitlines()[-1]}")
    from mtb_helpers.capstone.check import check_capstone
    for label in ("cold", "warm"):
        start = time.perf_counter()
        report = check_capstone(2, 2, 2, 1, steps=args.steps)
        print(f"check_capstone in one interpreter, {label}: {time.perf_counter() - start:.1f} s, "
              f"passed={report.passed}")


if __name__ == "__main__":
    main()
