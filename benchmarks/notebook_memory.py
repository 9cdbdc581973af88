"""Peak memory of each notebook on Binder's budget: 1 CPU, everything the notebook's kernel runs.

Each notebook is executed top to bottom in a fresh kernel (nbclient), pinned to one CPU with
``taskset -c 0`` (the kernel, its forkserver and every rank inherit the pinning). A sampler reads
the PSS (proportional set size: shared pages split between the processes sharing them, so the sum
over processes is what the tree really costs) of the kernel and all its descendants every
``--interval`` seconds and keeps the peak.

    python benchmarks/notebook_memory.py                       # every notebook in notebooks/
    python benchmarks/notebook_memory.py notebooks/03_tp_mlp.ipynb --interval 0.1

Prints one row per notebook: peak PSS of the tree, the cell being executed at that moment (its
index in the notebook and its first line), and at that moment the kernel's share, the forkserver's
and the ranks' (count and total). ``--cells N`` adds the N cells with the highest peaks, so a fix
aims at the cell that needs it. ``--unique`` (root only: it reads page frame numbers) also counts
the tree's distinct resident pages: PSS splits a page of libtorch with *every* process mapping it,
including other notebooks' kernels and other users' jobs on the machine, so the tree's PSS is lower
on a busy machine than on an idle one (by 60-90 MiB with a few other torch processes running); the
distinct pages are what the tree alone costs, whatever else runs. Binder gives 2 GB for JupyterLab
and every open kernel; the course's target (issue 24) is a peak of at most 560 MiB per notebook.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import threading
import time

MIB = 1024 * 1024
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tree_pss(pid: int) -> dict | None:
    """PSS of ``pid`` and its descendants, split into kernel / forkserver / ranks."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    parts = {"kernel": 0, "forkserver": 0, "ranks": 0, "other": 0, "n_ranks": 0}
    # The forkserver is the kernel's child that forks ranks (a fork of the kernel, or a new
    # interpreter whose command line names it); ranks are its children.
    rows = []
    for proc in procs:
        try:
            rows.append((proc.pid, proc.ppid(), " ".join(proc.cmdline()),
                         proc.memory_full_info().pss))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # ended between the listing and the reading
    parents = {parent for _, parent, _, _ in rows}
    children = {p for p, _, _, _ in rows if p != pid}
    for proc_pid, parent, cmd, pss in rows:
        if proc_pid == pid:
            parts["kernel"] += pss
        elif parent in children:
            parts["ranks"] += pss
            parts["n_ranks"] += 1
        elif "forkserver" in cmd or proc_pid in parents:
            parts["forkserver"] += pss
        else:
            parts["other"] += pss
    parts["total"] = sum(v for k, v in parts.items() if k != "n_ranks")
    return parts


def unique_mib(pid: int) -> float | None:
    """Distinct resident pages of ``pid`` and its descendants, in MiB (None: page frames unreadable)."""
    import numpy as np
    import psutil

    frames = []
    try:
        pids = [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return None
    for one in pids:
        try:
            with open(f"/proc/{one}/pagemap", "rb") as pm, open(f"/proc/{one}/maps") as maps:
                for line in maps:
                    lo, hi = (int(x, 16) for x in line.split(None, 1)[0].split("-"))
                    if lo >= 1 << 47:
                        continue  # [vsyscall]
                    pm.seek(lo // 4096 * 8)
                    entry = np.frombuffer(pm.read((hi - lo) // 4096 * 8), dtype=np.uint64)
                    frames.append(entry[(entry >> np.uint64(63)) == 1] & np.uint64((1 << 55) - 1))
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended meanwhile
    found = np.unique(np.concatenate(frames)) if frames else np.zeros(0, np.uint64)
    if len(found) and not found.any():
        return None  # without CAP_SYS_ADMIN every frame number reads 0
    return len(found[found != 0]) * 4096 / MIB


def measure_one(path: str, interval: float, timeout: int, unique: bool = False) -> dict:
    """Execute one notebook in a fresh kernel (this process is already pinned) and sample."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": os.path.dirname(path)}})
    peak: dict = {"total": 0}
    per_cell: dict[int, dict] = {}   # cell index -> the highest sample taken while it ran
    most_unique = [0.0]              # the most distinct pages seen (--unique)
    current = [-1]                   # the cell being executed (-1: the kernel is starting)
    stop = threading.Event()

    def sample(kernel_pid: int) -> None:
        while not stop.is_set():
            cell = current[0]  # read before sampling: a sample belongs to the cell it started in
            parts = tree_pss(kernel_pid)
            if parts:
                parts["cell"] = cell
                parts["unique"] = (unique_mib(kernel_pid) or 0) * MIB if unique else 0
                most_unique[0] = max(most_unique[0], parts["unique"])
                if parts["total"] > per_cell.get(cell, {"total": -1})["total"]:
                    per_cell[cell] = parts
                if parts["total"] > peak["total"]:
                    peak.update(parts)
            stop.wait(interval)

    slow: list[str] = []
    started = time.monotonic()
    with client.setup_kernel():
        kernel_pid = client.km.provisioner.process.pid
        sampler = threading.Thread(target=sample, args=(kernel_pid,), daemon=True)
        sampler.start()
        try:
            for index, cell in enumerate(nb.cells):
                cell_started = time.monotonic()
                current[0] = index
                client.execute_cell(cell, index)
                if time.monotonic() - cell_started > 30:  # a hang is not a memory figure
                    slow.append(f"cell {index}: {time.monotonic() - cell_started:.0f} s")
        finally:
            stop.set()
            sampler.join()
        peak["seconds"] = time.monotonic() - started  # the cells, without the kernel's shutdown
    peak["slow"] = slow
    peak["notebook"] = os.path.basename(path)
    peak["unique"] = most_unique[0]
    peak["cells"] = [{**parts, "source": _first_line(nb.cells[cell]) if cell >= 0 else "(kernel start)"}
                     for cell, parts in sorted(per_cell.items(), key=lambda kv: -kv[1]["total"])]
    return peak


def _first_line(cell) -> str:
    """The cell's first line that is not a comment or blank (what the cell does), shortened."""
    lines = [line.strip() for line in cell.source.splitlines()]
    line = next((x for x in lines if x and not x.startswith("#")), lines[0] if lines else "")
    return line if len(line) <= 60 else line[:57] + "..."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="default: notebooks/*.ipynb")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between samples")
    parser.add_argument("--timeout", type=int, default=120, help="per cell, seconds")
    parser.add_argument("--cpu", default="0", help="taskset CPU list (default 0: one CPU)")
    parser.add_argument("--json", action="store_true", help="one JSON object per notebook")
    parser.add_argument("--cells", type=int, default=0, metavar="N",
                        help="also list the N cells with the highest peak PSS of each notebook")
    parser.add_argument("--unique", action="store_true",
                        help="also count the tree's distinct resident pages (root only; see above)")
    parser.add_argument("--_one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._one:  # the child: already pinned by taskset
        print(json.dumps(measure_one(args.notebooks[0], args.interval, args.timeout, args.unique)))
        return
    paths = args.notebooks or sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
    pin = ["taskset", "-c", args.cpu] if shutil.which("taskset") and args.cpu else []
    if not pin:
        print("taskset not found: measuring on every CPU", file=sys.stderr)
    if not args.json:
        print("| notebook | peak PSS, whole tree | in cell | kernel | forkserver | ranks (n) | other "
              "| run time |" + (" peak distinct pages |" if args.unique else ""))
        print("|---|---:|---|---:|---:|---:|---:|---:|" + ("---:|" if args.unique else ""))
    for path in paths:
        out = subprocess.run([*pin, sys.executable, os.path.abspath(__file__), "--_one",
                              "--interval", str(args.interval), "--timeout", str(args.timeout),
                              *(["--unique"] if args.unique else []), path], capture_output=True, text=True, cwd=ROOT)
        if out.returncode != 0:
            print(f"| {os.path.basename(path)} | failed: {out.stderr.strip().splitlines()[-1:]} |")
            continue
        row = json.loads(out.stdout.strip().splitlines()[-1])
        if args.json:
            print(json.dumps(row))
            continue
        print(f"| {row['notebook']} | {row['total'] / MIB:,.0f} MiB | {row['cell']} | "
              f"{_parts(row)} | {row['seconds']:.0f} s |", *_unique(row, args), *row["slow"], flush=True)
        for cell in row["cells"][:args.cells]:
            print(f"|  cell {cell['cell']}: `{cell['source']}` | {cell['total'] / MIB:,.0f} MiB | "
                  f"{cell['cell']} | {_parts(cell)} | |", *_unique(cell, args), flush=True)


def _unique(row: dict, args) -> list[str]:
    return [f"{row.get('unique', 0) / MIB:,.0f} MiB |"] if args.unique else []


def _parts(row: dict) -> str:
    return (f"{row['kernel'] / MIB:,.0f} | {row['forkserver'] / MIB:,.0f} | "
            f"{row['ranks'] / MIB:,.0f} ({row['n_ranks']}) | {row['other'] / MIB:,.0f}")


if __name__ == "__main__":
    main()
