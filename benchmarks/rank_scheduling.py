"""Ranks under SCHED_BATCH against the normal policy: the capstone's training call, alternating.

Each rank runs under Linux's SCHED_BATCH (``runtime/worker.py: batch_scheduling``). This measures
what that buys where students run, every process on one CPU: the call the capstone explorer makes
at every redraw (3 AdamW steps of the tiny GPT at tp=2 pp=2 on 4 ranks, 2 micro-batches, 1F1B,
sequence parallel) is run with every thread of every rank switched to one policy, then the other,
in pairs whose order alternates (normal, batch, batch, normal, ...), so both see the same moments
of the machine. Printed: the median wall time of the call and the median CPU time of its ranks
(summed), per policy.

    taskset -c 0 python benchmarks/rank_scheduling.py              # 32 calls after 4 warm ones
    taskset -c 0 python benchmarks/rank_scheduling.py --calls 64
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from mtb_helpers.capstone.grid import GridLayout
from mtb_helpers.capstone.model import GPTConfig
from mtb_helpers.capstone.parallel import train_on_rank
from mtb_helpers.capstone.reference import TrainConfig
from mtb_helpers.runtime.ranks import run

POLICIES = {"normal (SCHED_OTHER)": os.SCHED_OTHER, "batch (SCHED_BATCH)": os.SCHED_BATCH}


def _train_under(policy: int, *args) -> float:
    """On a rank: every thread of this process (gloo's too) under ``policy``, then the call; its
    CPU seconds (all threads)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setscheduler(int(tid), policy, os.sched_param(0))
        except OSError:   # a thread that ended meanwhile
            pass
    start = time.process_time()
    train_on_rank(*args)
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=32, help="timed calls, half under each policy")
    args = parser.parse_args()
    if args.calls < 4:
        parser.error("--calls must be at least 4")
    layout, run_cfg = GridLayout(tp=2, pp=2), TrainConfig(steps=3)
    call = ((GPTConfig(), run_cfg.seed, torch.float64), layout, run_cfg, 2, "1f1b", True, "ddp")
    names = list(POLICIES)
    seen: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for i in range(4 + args.calls):
        name = names[(i % 4) in (1, 2)]
        began = time.perf_counter()
        cpu = run(_train_under, POLICIES[name], *call, world_size=layout.world_size, timeout=120)
        if i >= 4:   # the first calls make the groups and warm the caches
            seen[name].append((time.perf_counter() - began, sum(cpu)))
    print("| ranks' policy | call, median wall (min-max) | ranks' CPU, median (summed) |")
    print("|---|---:|---:|")
    for name, rows in seen.items():
        walls = [w * 1e3 for w, _ in rows]
        print(f"| {name} | {statistics.median(walls):.0f} ms ({min(walls):.0f}-{max(walls):.0f}) | "
              f"{statistics.median(c for _, c in rows) * 1e3:.0f} ms |")


if __name__ == "__main__":
    main()
