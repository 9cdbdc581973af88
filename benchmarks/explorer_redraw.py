"""How long a student waits after moving an explorer's main slider, measured in a real kernel.

For each explorer: start a fresh Jupyter kernel (jupyter_client), import the explorer's module
(as a notebook's import cell does, no pool started), build and display the explorer at 4 ranks
("first": the cold pool starts, the check runs, the figures are drawn), then move its world-size
slider (the grid shape for the tp x dp explorer) back and forth by sending the kernel the comm
message a front end sends when a student drags it (so the kernel handles a widget message, not a
cell: the pools' memory budget keeps a slider's pools warm only for widget messages). The
observer re-runs the check on real ranks and redraws; the time is from sending the change to the
kernel reporting idle again, after the new figures were sent (as display data or as an image
widget's new value). "new setting" is the first move to the other value (its figures drawn for
the first time, its pool started before by a warm-up call); "median" is over the moves back to 4
ranks.

    taskset -c 0 python benchmarks/explorer_redraw.py                  # every explorer, this tree
    taskset -c 0 python benchmarks/explorer_redraw.py --baseline /work/wt/_base   # before and after
    taskset -c 0 python benchmarks/explorer_redraw.py --only tp-mlp --baseline DIR --repeats 5
    taskset -c 0 python benchmarks/explorer_redraw.py --only tp-mlp --moves 8 --profile
    taskset -c 0 python benchmarks/explorer_redraw.py --warm-up       # import cell as in notebooks

``--warm-up`` adds what every notebook's import cell also does, ``warm_up(2, 4)``: the
forkserver starts in that cell (torch's lazy imports with it) and the pools in the background,
so "first" is what a student who runs the explorer cell right after the import cell waits for.
Without it (the default) "first" starts the forkserver and the pool from cold.

``--baseline DIR`` measures each explorer in two kernels, one importing the package from DIR (an
untouched checkout of an older commit) and one importing it from this tree. Both are built in
turn (the other idle), then their timed moves alternate, the order swapped every pair (before,
now, now, before, ...), so both see the same moments of the machine; the table gains the ratio
of the medians. ``--repeats K`` runs K such rounds, fresh kernels each: the move columns then pool
every round's moves, "new setting" and "first" are medians over rounds, and with ``--baseline``
a last column gives the median and range of the K rounds' ratios (how far one round's ratio
moves). ``--profile`` writes the last profiled move of this tree to /tmp/explorer_redraw.prof
(the baseline's to /tmp/explorer_redraw.0.prof).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROFILE = "/tmp/explorer_redraw.prof"

# name -> (the import cell, the cell that builds the explorer in ``w`` at 4 ranks, how to find its
# main control, values to alternate between: the first is the 4-rank setting that is timed)
EXPLORERS = {
    "tp-mlp": ("from mtb_helpers.tp.widget import tp_explorer", "w = tp_explorer('mlp', world_size=4)",
               "world size", (4, 3)),
    "tp-column": ("from mtb_helpers.tp.widget import tp_explorer",
                  "w = tp_explorer('column', world_size=4)", "world size", (4, 3)),
    "tp-row": ("from mtb_helpers.tp.widget import tp_explorer",
               "w = tp_explorer('row', world_size=4)", "world size", (4, 3)),
    "collectives": ("from mtb_helpers.collectives.widget import collectives_explorer",
                    "w = collectives_explorer(world_size=4)", "world size", (4, 3)),
    "sp": ("from mtb_helpers.sp.widget import explore_sequence_parallel",
           "w = explore_sequence_parallel(world_size=4)", "world size", (4, 2)),
    "dp": ("from mtb_helpers.dp.widget import explore_data_parallel",
           "w = explore_data_parallel(world_size=4)", "world size", (4, 3)),
    "moe": ("from mtb_helpers.moe.widget import explore_moe", "w = explore_moe(world_size=4)",
            "world size", (4, 2)),
    "grid": ("from mtb_helpers.grid.widget import grid_explorer", "w = grid_explorer(world_size=4)",
             "grid", ("tp=2 x dp=2", "tp=1 x dp=4")),
    "cp": ("from mtb_helpers.cp.widget import explore_context_parallel",
           "w = explore_context_parallel(world_size=4)", "world size", (4, 3)),
    "cp-balance": ("from mtb_helpers.cp.widget import explore_balance",
                   "w = explore_balance(world_size=4)", "world size", (4, 3)),
    "pp-ranks": ("from mtb_helpers.pp.widget import explore_pipeline_on_ranks",
                 "w = explore_pipeline_on_ranks('1f1b', stages=4, microbatches=4)", "stages", (4, 3)),
    "capstone": ("from mtb_helpers.capstone.widget import explore_capstone",
                 "w = explore_capstone(layout='tp=2 pp=2 dp=1 cp=1', steps=2)", "layout",
                 ("tp=2 pp=2 dp=1 cp=1", "tp=2 pp=1 dp=2 cp=1")),
}

FIND = """
import ipywidgets as _widgets
def _controls(widget):
    yield widget
    for child in getattr(widget, 'children', ()):
        yield from _controls(child)
_main = next(c for c in _controls(w) if isinstance(c, (_widgets.IntSlider, _widgets.Dropdown))
             and str(c.description).startswith({prefix!r}))
_values = {values!r}
import json as _json
def _state(v):
    if isinstance(_main, _widgets.Dropdown):   # a front end sends the option's index
        return {{'index': [o[1] if isinstance(o, tuple) else o for o in _main.options].index(v)}}
    return {{'value': v}}
print(_json.dumps({{'comm_id': _main.model_id, 'states': [_state(v) for v in _values]}}))
"""


def _send_change(kc, change: tuple[str, dict]) -> str:
    """What a front end sends when a student moves a widget: a comm message updating its state."""
    comm_id, state = change
    msg = kc.session.msg("comm_msg", {"comm_id": comm_id, "data": {
        "method": "update", "state": state, "buffer_paths": []}})
    kc.shell_channel.send(msg)
    return msg["header"]["msg_id"]


def _execute(kc, code: str | tuple[str, dict], timeout: float = 300.0, figures: int = 0,
             printed: list[str] | None = None) -> float:
    """Run ``code`` (a cell's source, or a widget change ``(comm id, state)`` sent as a front end
    does); return seconds until the kernel is idle again. Raise on an error, or if fewer than
    ``figures`` PNG images were sent (a redraw that only printed an error): as display data (an
    Output) or as an image widget's new value (a comm message carrying a buffer). What the code
    printed is appended to ``printed``."""
    start = time.perf_counter()
    msg_id = _send_change(kc, code) if isinstance(code, tuple) else kc.execute(code, store_history=False)
    error, images, text = None, 0, []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        if kind == "error":
            error = "\n".join(msg["content"]["traceback"][-3:])
        if kind in ("display_data", "update_display_data"):
            images += "image/png" in msg["content"]["data"]
        if kind == "comm_msg" and msg.get("buffers"):
            images += 1
        if kind == "stream":
            text.append(msg["content"]["text"])
            if printed is not None:
                printed.append(msg["content"]["text"])
        if kind == "comm_msg":
            state = msg["content"].get("data", {}).get("state", {})
            if isinstance(state.get("value"), str) and state["value"].startswith("<pre"):
                text.append(state["value"])
        if kind == "status" and msg["content"]["execution_state"] == "idle":
            elapsed = time.perf_counter() - start
            break
    if error:
        raise RuntimeError(error)
    if images < figures:
        raise RuntimeError(f"the redraw showed {images} figure(s): {''.join(text)[-200:]!r}")
    return elapsed


class Kernel:
    """One fresh kernel importing the package from ``tree``, with one explorer built in it."""

    def __init__(self, name: str, tree: str, warm: bool, profile: str | None) -> None:
        from jupyter_client.manager import start_new_kernel

        self.name, self.tree, self.profile = name, tree, profile
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [tree, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]))
        self.km, self.kc = start_new_kernel(kernel_name="python3", env=env)
        self.times: list[float] = []
        imports = EXPLORERS[name][0]
        _execute(self.kc, "%matplotlib inline\nfrom IPython.display import display\n" + imports
                 + ("\nfrom mtb_helpers import warm_up\nwarm_up(2, 4)" if warm else ""))

    def build(self) -> None:
        """Build and display the explorer ("first"), warm the other setting's pool, move there
        once ("new setting")."""
        _, build, prefix, values = EXPLORERS[self.name]
        self.first = _execute(self.kc, build + "\ndisplay(w)", figures=1)
        printed: list[str] = []
        _execute(self.kc, FIND.format(prefix=prefix, values=values), printed=printed)
        found = json.loads("".join(printed))
        self.to = [(found["comm_id"], state) for state in found["states"]]   # to 4 ranks, away
        _execute(self.kc, "import mtb_helpers as _m\nif isinstance(_values[1], int) and _values[1] > 1:\n"
                          "    _m.run(int, world_size=_values[1])")   # its pool warm, not its figures
        self.new = _execute(self.kc, self.to[1], figures=1)

    def move(self) -> None:
        """One timed move to the 4-rank setting, then an untimed move back."""
        if self.profile:   # the kernel's handler runs in its main thread: profiled from cells
            _execute(self.kc, "import cProfile, pstats\n_p = cProfile.Profile(); _p.enable()")
        self.times.append(_execute(self.kc, self.to[0], figures=1))
        if self.profile:
            _execute(self.kc, "_p.disable(); pstats.Stats(_p).sort_stats('cumtime')"
                              f".dump_stats({self.profile!r})")
        _execute(self.kc, self.to[1], figures=1)

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def measure_round(name: str, moves: int, profile: bool, trees: list[str],
                  warm: bool = False) -> list[dict]:
    """One round: one fresh kernel per tree (each built in turn, the others idle), then their
    timed moves interleaved, the order swapped every pair (A B, B A, A B, ...): a machine that
    drifts during the round slows both trees alike instead of the one measured last."""
    kernels: list[Kernel] = []
    tree = trees[0]
    try:
        for i, tree in enumerate(trees):
            # this tree's profile; the last tree's ("now") goes where --profile's help says
            path = PROFILE if i == len(trees) - 1 else PROFILE.replace(".prof", f".{i}.prof")
            kernels.append(Kernel(name, tree, warm, path if profile else None))
            kernels[-1].build()
        for i in range(moves):
            for k in (kernels if i % 2 == 0 else kernels[::-1]):
                tree = k.tree
                k.move()
        return [{"explorer": name, "times": k.times, "first_ms": 1000 * k.first,
                 "new_ms": 1000 * k.new} for k in kernels]
    except Exception as exc:
        said = str(exc).splitlines()[-1] if str(exc) else repr(exc)
        raise RuntimeError(f"in {tree}: {said}") from exc
    finally:
        for k in kernels:
            k.close()


def summary(rounds: list[dict]) -> dict:
    """One tree's rounds: median, min and max over every timed move of every round; the medians
    over rounds of "new setting" and "first"."""
    times = [t for r in rounds for t in r["times"]]
    return {"median_ms": 1000 * statistics.median(times), "min_ms": 1000 * min(times),
            "max_ms": 1000 * max(times), "moves": len(times),
            "new_ms": statistics.median(r["new_ms"] for r in rounds),
            "first_ms": statistics.median(r["first_ms"] for r in rounds)}


def _cells(row: dict | None) -> str:
    if row is None:
        return "failed | | |"
    return (f"{row['median_ms']:,.0f} ms ({row['min_ms']:,.0f}-{row['max_ms']:,.0f}) | "
            f"{row['new_ms']:,.0f} ms | {row['first_ms']:,.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", choices=list(EXPLORERS), default=list(EXPLORERS))
    parser.add_argument("--moves", type=int, default=6, help="timed moves to 4 ranks per round (>= 6)")
    parser.add_argument("--repeats", dest="repeat", type=int, default=1, metavar="K",
                        help="whole rounds (fresh kernels each) per explorer; with --baseline the "
                             "table adds the median and range of the rounds' ratios")
    parser.add_argument("--baseline", metavar="DIR",
                        help="also measure the package imported from DIR (an older checkout)")
    parser.add_argument("--warm-up", action="store_true",
                        help="the import cell also calls warm_up(2, 4), as the notebooks' do")
    parser.add_argument("--profile", action="store_true",
                        help=f"cProfile the last move into {PROFILE}")
    args = parser.parse_args()
    if args.moves < 1 or args.repeat < 1:
        parser.error("--moves and --repeats must be at least 1")
    trees = ([("before", os.path.abspath(args.baseline))] if args.baseline else []) + [("now", ROOT)]
    per_round = args.baseline and args.repeat > 1
    head = " | ".join(f"{label}: median redraw at 4 ranks (min-max) | {label}: new setting | "
                      f"{label}: first (cold pool)" for label, _ in trees)
    print(f"| explorer | {head} |" + (" now / before |" if args.baseline else "")
          + (f" now / before per round, median (min-max of {args.repeat}) |" if per_round else ""))
    print("|---|" + "---:|---:|---:|" * len(trees) + ("---:|" if args.baseline else "")
          + ("---:|" if per_round else ""))
    for name in args.only:
        rounds = []
        try:
            for _ in range(args.repeat):
                rounds.append(measure_round(name, args.moves, args.profile,
                                            [tree for _, tree in trees], args.warm_up))
            rows = [summary([r[i] for r in rounds]) for i in range(len(trees))]
        except Exception as exc:  # noqa: BLE001  (one broken explorer must not hide the others)
            print(f"<!-- {name}: {str(exc).splitlines()[-1][:200]} -->", flush=True)
            rows = [None] * len(trees)
        ratio = (f" {rows[1]['median_ms'] / rows[0]['median_ms']:.2f} |"
                 if args.baseline and None not in rows else (" |" if args.baseline else ""))
        if per_round and None not in rows:
            each = [statistics.median(now["times"]) / statistics.median(before["times"])
                    for before, now in rounds]
            ratio += f" {statistics.median(each):.2f} ({min(each):.2f}-{max(each):.2f}) |"
        elif per_round:
            ratio += " |"
        print(f"| {name} | " + " | ".join(_cells(r) for r in rows) + " |" + ratio, flush=True)


if __name__ == "__main__":
    main()
