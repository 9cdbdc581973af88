"""How quickly does a student hear about a failing or hung rank, and is the next call fine?

    python benchmarks/failure_latency.py

A rank that raises while the others wait in a barrier (timeout 60 s: the error must not wait for
it), a mismatched all-reduce (timeout 5 s: the error must come a moment after it), then a normal
call, which has to start a fresh pool because a failure always replaces the old one.
"""
import time

import torch
import torch.distributed as dist

from mtb_helpers import RankError, RankTimeoutError, run, shutdown


def fails() -> None:
    if dist.get_rank() == 1:
        raise ValueError("boom")
    dist.barrier()


def hangs() -> None:
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(2))


if __name__ == "__main__":
    run(lambda: 0, world_size=4)
    t = time.perf_counter()
    try:
        run(fails, world_size=4, timeout=60)
    except RankError as e:
        print(f"RankError from rank {e.rank} after {time.perf_counter() - t:.2f} s (timeout=60)")
    t = time.perf_counter()
    try:
        run(hangs, world_size=4, timeout=5)
    except RankTimeoutError as e:
        print(f"RankTimeoutError after {time.perf_counter() - t:.2f} s (timeout=5); "
              f"waiting: {sorted(e.waiting)}")
    t = time.perf_counter()
    ranks = run(lambda: dist.get_rank(), world_size=4)
    print(f"next call {ranks} on a fresh pool: {time.perf_counter() - t:.2f} s")
    shutdown()
