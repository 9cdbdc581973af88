"""The planner's predicted teraFLOP/s per GPU against Narayanan et al. 2021's Table 1 (BENCHMARKS.md,
"Choosing a layout: published throughput"). Arithmetic only: no rank starts, nothing is allocated;
about a minute of CPU (plan() over up to 3072 GPUs for the ranks).

    python benchmarks/plan_published.py [--efficiency 0.869] [--no-rank] [--json]

For each row: the published layout (tp, pp, dp, micro-batch, schedule of the authors' script,
full recompute, fp16, no ZeRO), the published and the predicted teraFLOP/s per GPU (the paper's
FLOPs, recompute included, over the planner's step time with every matmul at ``--efficiency`` of
312 TFLOP/s: one number for every row, Bekman's measured A100 matmul maximum by default), the gap,
the published layout's rank among plan()'s layouts (all of them, and those Megatron-LM could run
in 2021: no ZeRO, no selective recompute, no sequence parallelism), plan()'s best layout and how
much faster the planner thinks it is, and the efficiency the planner would need to match the
published figure (a diagnostic found by bisection, not an input anywhere).
"""
from __future__ import annotations

import argparse
import json

from mtb_helpers.plan.published import (A100_MATMUL_EFFICIENCY, NARAYANAN_2021_TABLE_1, compare,
                                        step_flops)
from mtb_helpers.plan.steptime import step_time


def implied_efficiency(c, lo: float = 0.05, hi: float = 1.0, steps: int = 30) -> float | None:
    """The matmul efficiency at which the planner predicts the published teraFLOP/s (None if
    even 100 % of peak falls short)."""
    def tflops(e):
        t = step_time(c.model, c.cluster, c.layout, efficiency=e, overlap=c.row.ddp == "torch")
        return step_flops(c.model, c.layout) / t.step / c.row.gpus / 1e12
    if tflops(hi) < c.published_tflops:
        return None
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tflops(mid) < c.published_tflops else (lo, mid)
    return (lo + hi) / 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--efficiency", type=float, default=A100_MATMUL_EFFICIENCY,
                    help="fraction of 312 TFLOP/s every matmul reaches (default %(default).3f)")
    ap.add_argument("--no-rank", action="store_true", help="skip plan() (seconds instead of a minute)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for r in NARAYANAN_2021_TABLE_1:
        c = compare(r, efficiency=args.efficiency, rank=not args.no_rank)
        rows.append(dict(row=r.name, layout=c.layout.short(), published=r.tflops_per_gpu,
                         predicted=c.predicted_tflops, gap=c.gap, peak_gib=c.peak_bytes / 2 ** 30,
                         fits=c.fits, rank=c.rank, of=c.of, rank_2021=c.rank_2021,
                         of_2021=c.of_2021, best=c.best.short() if c.best else None,
                         best_speedup=c.best_speedup,
                         best_2021=c.best_2021.short() if c.best_2021 else None,
                         implied=implied_efficiency(c),
                         terms={k: v for k, v in c.time.terms.items() if v}, step=c.time.step))
    if args.json:
        print(json.dumps(dict(efficiency=args.efficiency, rows=rows), indent=1))
        return
    print(f"Narayanan et al. 2021, Table 1, on {NARAYANAN_2021_TABLE_1[-1].gpus} A100s at most; "
          f"every matmul at {args.efficiency:.1%} of 312 TFLOP/s\n")
    print(f"{'row':>5}  {'published layout':<44} {'GiB':>5} {'pub':>4} {'pred':>6} {'gap':>7} "
          f"{'rank':>9} {'rank 2021':>9} {'best x':>6} {'eff. to match':>13}")
    for d in rows:
        lay = d["layout"].replace(" dtype=fp16", "").replace(" recompute=full", "") \
            .replace(" zero=0", "").replace("schedule=interleaved", "interl.")
        rank = f"{d['rank']}/{d['of']}" if d["rank"] else "-"
        r21 = f"{d['rank_2021']}/{d['of_2021']}" if d["rank_2021"] else "-"
        best = f"{d['best_speedup']:.2f}" if d["best_speedup"] else "-"
        imp = f"{d['implied']:.1%}" if d["implied"] else "> 100 %"
        print(f"{d['row']:>5}  {lay:<44} {d['peak_gib']:>5.1f} {d['published']:>4.0f} "
              f"{d['predicted']:>6.1f} {d['gap']:>+7.1%} {rank:>9} {r21:>9} {best:>6} {imp:>13}")
    print("\nlayouts: zero=0, recompute=full, fp16 and no sequence parallelism everywhere (the "
          "paper's runs); GiB: the busiest rank by the planner's accounting (80 GiB per GPU)")
    print("rank: 1 + plan()'s layouts predicted faster (of those that fit); rank 2021: the same "
          "among those Megatron-LM could run then; best x: published step / plan()'s best step")
    if rows[0]["best"]:
        print("\nplan()'s best (all options | 2021 options):")
        for d in rows:
            print(f"  {d['row']:>5}  {d['best']:<52} | {d['best_2021']}")
    print("\npredicted step, exposed seconds by cause:")
    for d in rows:
        print(f"  {d['row']:>5}  {d['step']:7.2f} s  " + ", ".join(f"{k} {v:.2f}"
                                                             for k, v in d["terms"].items()))


if __name__ == "__main__":
    main()
