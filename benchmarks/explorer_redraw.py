"""How long a student waits after moving an explorer's main slider, measured in a real kernel.

For each explorer: start a fresh Jupyter kernel (jupyter_client), build and display the explorer
at 4 ranks, then move its world-size slider (the grid shape for the tp x dp explorer) back and
forth by setting the widget's value from the kernel, as the front end's comm message would. The
observer re-runs the check on real ranks and redraws the Output; the time is from sending the
change to the kernel reporting idle again, after the Output's new figures were sent. The table
reports the median over the moves that land on 4 ranks (the first move, which may start a
pool, is not counted).

    python benchmarks/explorer_redraw.py                  # every explorer, 6 moves to 4 ranks
    python benchmarks/explorer_redraw.py --only tp-mlp --moves 8 --profile
"""
from __future__ import annotations

import argparse
import statistics
import time

# name -> (code that leaves the explorer in ``w``; how to find its main control; values to
# alternate between, the first one being the 4-rank setting that is timed)
EXPLORERS = {
    "tp-mlp": ("from mtb_helpers.tp.widget import tp_explorer\nw = tp_explorer('mlp', world_size=4)",
               "world size", (4, 3)),
    "tp-column": ("from mtb_helpers.tp.widget import tp_explorer\n"
                  "w = tp_explorer('column', world_size=4)", "world size", (4, 3)),
    "tp-row": ("from mtb_helpers.tp.widget import tp_explorer\nw = tp_explorer('row', world_size=4)",
               "world size", (4, 3)),
    "collectives": ("from mtb_helpers.collectives.widget import collectives_explorer\n"
                    "w = collectives_explorer(world_size=4)", "world size", (4, 3)),
    "sp": ("from mtb_helpers.sp.widget import explore_sequence_parallel\n"
           "w = explore_sequence_parallel(world_size=4)", "world size", (4, 2)),
    "dp": ("from mtb_helpers.dp.widget import explore_data_parallel\n"
           "w = explore_data_parallel(world_size=4)", "world size", (4, 3)),
    "moe": ("from mtb_helpers.moe.widget import explore_moe\nw = explore_moe(world_size=4)",
            "world size", (4, 2)),
    "grid": ("from mtb_helpers.grid.widget import grid_explorer\nw = grid_explorer(world_size=4)",
             "grid", None),
}

FIND = """
import ipywidgets as _widgets
def _controls(widget):
    yield widget
    for child in getattr(widget, 'children', ()):
        yield from _controls(child)
_main = next(c for c in _controls(w) if isinstance(c, (_widgets.IntSlider, _widgets.Dropdown))
             and str(c.description).startswith({prefix!r}))
_values = {values!r} or tuple(o if isinstance(o, str) else o[1] for o in _main.options)[:2]
"""


def _execute(kc, code: str, timeout: float = 300.0, figures: int = 0) -> float:
    """Run ``code``; return seconds until the kernel is idle again. Raise on an error, or if
    fewer than ``figures`` PNG images were displayed (a redraw that only printed an error)."""
    start = time.perf_counter()
    msg_id = kc.execute(code, store_history=False)
    error, images, text = None, 0, []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "error":
            error = "\n".join(msg["content"]["traceback"][-3:])
        if msg["msg_type"] in ("display_data", "update_display_data"):
            images += "image/png" in msg["content"]["data"]
        if msg["msg_type"] == "stream":
            text.append(msg["content"]["text"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            elapsed = time.perf_counter() - start
            break
    if error:
        raise RuntimeError(error)
    if images < figures:
        raise RuntimeError(f"the redraw showed {images} figure(s): {''.join(text)[-200:]!r}")
    return elapsed


def measure(name: str, moves: int, profile: bool) -> dict:
    from jupyter_client.manager import start_new_kernel

    setup, prefix, values = EXPLORERS[name]
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        _execute(kc, "%matplotlib inline\nfrom IPython.display import display\n" + setup
                 + "\ndisplay(w)")
        _execute(kc, FIND.format(prefix=prefix, values=values))
        _execute(kc, "_main.value = _values[1]")  # warms the other pool too
        times = []
        for _ in range(moves):
            code = "_main.value = _values[0]"
            if profile:
                code = ("import cProfile, pstats\n_p = cProfile.Profile(); _p.enable()\n" + code
                        + "\n_p.disable(); pstats.Stats(_p).sort_stats('cumtime')"
                          ".dump_stats('/tmp/explorer_redraw.prof')")
            times.append(_execute(kc, code, figures=1))
            _execute(kc, "_main.value = _values[1]")
        return {"explorer": name, "median_ms": 1000 * statistics.median(times),
                "min_ms": 1000 * min(times), "max_ms": 1000 * max(times), "moves": len(times)}
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", choices=list(EXPLORERS), default=list(EXPLORERS))
    parser.add_argument("--moves", type=int, default=6, help="timed moves to 4 ranks (>= 6)")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile the last move into /tmp/explorer_redraw.prof")
    args = parser.parse_args()
    print("| explorer | median redraw at 4 ranks | min | max | moves |")
    print("|---|---:|---:|---:|---:|")
    for name in args.only:
        try:
            row = measure(name, args.moves, args.profile)
        except Exception as exc:  # noqa: BLE001  (one broken explorer must not hide the others)
            print(f"| {name} | failed: {str(exc).splitlines()[-1][:120]} | | | |", flush=True)
            continue
        print(f"| {row['explorer']} | {row['median_ms']:,.0f} ms | {row['min_ms']:,.0f} | "
              f"{row['max_ms']:,.0f} | {row['moves']} |", flush=True)


if __name__ == "__main__":
    main()
