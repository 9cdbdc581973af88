"""``minitrainbench plan``: every layout of a model on a cluster, ranked, headless. Arithmetic only.

    minitrainbench plan --model llama3-8b --gpus 64 --gpu-memory 80 --global-batch 1024 [--json]

Prints the fastest layouts that fit (predicted step time, tokens/s, MFU, the busiest rank's GiB)
and one example of each reason a layout was refused. Exit 0 when some layout fits, 1 when none
does, 2 on bad arguments (an unknown model or cluster, a GPU count that is not whole nodes).
"""
from __future__ import annotations

import argparse

from mtb_helpers.cli.common import print_document
from mtb_helpers.plan.presets import CLUSTERS, GIB, MODELS, cluster, model
from mtb_helpers.plan.search import plan

__all__ = ["register", "run_plan"]


def register(top: argparse._SubParsersAction, groups: dict[str, argparse._SubParsersAction]) -> None:
    """Add ``minitrainbench plan``."""
    parser = top.add_parser(
        "plan", help="rank every tp x pp x dp x cp x ep layout of a model on a cluster",
        description="Predict memory per rank and step time of every layout of a published model "
                    "on a cluster of GPUs (ZeRO's and Korthikanti et al.'s formulas, the alpha-beta "
                    "model, the course's pipeline simulator); list the ones that fit, fastest "
                    "first, and why the others were refused. Nothing is run or allocated.")
    parser.add_argument("--model", required=True, help=f"one of {', '.join(MODELS)}")
    parser.add_argument("--gpus", type=int, required=True, help="number of GPUs")
    parser.add_argument("--gpu-memory", type=float, default=None,
                        help="GiB per GPU (default: the cluster preset's, 80)")
    parser.add_argument("--global-batch", type=int, required=True, help="sequences per step")
    parser.add_argument("--seq-len", type=int, default=None,
                        help="tokens per sequence (default: the model's)")
    parser.add_argument("--cluster", default="h100", help=f"one of {', '.join(CLUSTERS)} (h100)")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--mfu", type=float, default=0.5,
                        help="fraction of peak FLOP/s the matmuls reach, your assumption (0.5)")
    parser.add_argument("--reserve", type=float, default=0.0,
                        help="GiB per GPU kept for the CUDA context, NCCL and fragmentation (0)")
    parser.add_argument("--top", type=int, default=10, help="layouts to list (10)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench plan``; ValueError (exit 2) on bad input."""
    if args.top < 1:
        raise ValueError(f"--top must be a positive integer, got {args.top}")
    spec = model(args.model)
    gpus = cluster(args.cluster, args.gpus, args.gpu_memory, args.gpus_per_node)
    result = plan(spec, gpus, args.global_batch, args.seq_len, mfu=args.mfu,
                  reserve=args.reserve * GIB)
    if args.json:
        print_document(result.to_dict(top=args.top))
    else:
        print(result.table(args.top))
    return 0 if result.ranked else 1
