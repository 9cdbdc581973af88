"""How long does a notebook wait for its ranks? ``mtb_helpers.run`` against ``mp.spawn``.

    python benchmarks/bench_run.py [--sizes 1 2 4 8] [--repeats 3] [--warm-calls 50]

For each world size, in one run on one machine:
* cold: a fresh interpreter that has imported torch and mtb_helpers calls ``run`` once (the
  forkserver starts, imports torch once, forks the ranks, they join a gloo group);
* warm: the median of repeated ``run`` calls on the live pool (a slider being dragged);
* spawn: ``torch.multiprocessing.spawn`` running the same job, each rank a fresh interpreter that
  imports torch and joins a gloo group through a FileStore; what a notebook pays without a pool.
The job is the same everywhere: a 1024-float all-reduce. Prints a Markdown table of medians.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

COLD = """
import time, torch, torch.distributed as dist
from mtb_helpers import run
def job():
    t = torch.ones(1024); dist.all_reduce(t); return float(t[0])
t0 = time.perf_counter(); run(job, world_size={n}); print(time.perf_counter() - t0)
"""


def job() -> float:
    import torch
    import torch.distributed as dist

    t = torch.ones(1024)
    dist.all_reduce(t)
    return float(t[0])


def _spawn_rank(rank: int, world_size: int, store_path: str) -> None:
    import torch.distributed as dist

    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    job()
    dist.destroy_process_group()


def time_spawn(world_size: int) -> float:
    import torch.multiprocessing as tmp

    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        tmp.spawn(_spawn_rank, args=(world_size, os.path.join(d, "store")), nprocs=world_size)
        return time.perf_counter() - t0


def time_cold(world_size: int) -> float:
    out = subprocess.run([sys.executable, "-c", COLD.format(n=world_size)], check=True,
                         capture_output=True, text=True)
    return float(out.stdout.split()[-1])


def time_warm(world_size: int, calls: int) -> float:
    from mtb_helpers import run

    run(job, world_size=world_size)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        run(job, world_size=world_size)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warm-calls", type=int, default=50)
    args = parser.parse_args()
    print(f"# {os.cpu_count()} cores, Python {sys.version.split()[0]}, medians; "
          f"cold and spawn over {args.repeats} runs, warm over {args.warm_calls} calls\n")
    print("| ranks | mp.spawn | run, cold | run, warm | spawn / warm | spawn / cold |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in args.sizes:
        spawn = statistics.median(time_spawn(n) for _ in range(args.repeats))
        cold = statistics.median(time_cold(n) for _ in range(args.repeats))
        warm = time_warm(n, args.warm_calls)
        print(f"| {n} | {spawn:.2f} s | {cold:.2f} s | {warm * 1e3:.1f} ms | "
              f"{spawn / warm:.0f}x | {spawn / cold:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
