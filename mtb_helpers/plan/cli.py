"""``minitrainbench plan``: every layout of a model on a cluster, ranked, headless. Arithmetic only.

    minitrainbench plan --model llama3-8b --gpus 64 --gpu-memory 80 --global-batch 1024 [--json]

Prints the fastest layouts that fit (predicted step time, tokens/s, MFU, the busiest rank's GiB)
and one example of each reason a layout was refused. Exit 0 when some layout fits, 1 when none
does, 2 on bad arguments (an unknown model or cluster, a GPU count that is not whole nodes or has
too many layouts to weigh, a --reserve that leaves no memory), named as typed.
"""
from __future__ import annotations

import argparse

from mtb_helpers.checking.command import add_command, emit_document, integer, naming, real
from mtb_helpers.plan.presets import CLUSTERS, GIB, MODELS, cluster, model
from mtb_helpers.plan.search import check_gpus, check_reserve, plan

__all__ = ["register", "run_plan"]


def register(top: argparse._SubParsersAction, groups: dict[str, argparse._SubParsersAction]) -> None:
    """Add ``minitrainbench plan``."""
    whole = {"type": integer(1), "required": True}
    add_command(
        top, "plan", "rank every tp x pp x dp x cp x ep layout of a model on a cluster",
        "Predict memory per rank and step time of every layout of a published model on a cluster "
        "of GPUs (ZeRO's and Korthikanti et al.'s formulas, the alpha-beta model, the course's "
        "pipeline simulator); list the ones that fit, fastest first, and why the others were "
        "refused. Nothing is run or allocated.", run_plan, common=None,
        json_help="print one JSON document",
        model={"required": True, "help": f"one of {', '.join(MODELS)}"},
        gpus=dict(whole, help="number of GPUs"),
        gpu_memory={"type": real(), "default": None,
                    "help": "GiB per GPU (default: the cluster preset's, 80)"},
        global_batch=dict(whole, help="sequences per step"),
        seq_len={"type": integer(1), "default": None,
                 "help": "tokens per sequence (default: the model's)"},
        cluster=("h100", f"one of {', '.join(CLUSTERS)} (h100), or a .json from "
                         "benchmarks/gpu_layer.py"),
        gpus_per_node={"type": integer(1), "default": 8},
        mfu={"type": real(0.0, 1.0), "default": None,
             "help": "fraction of peak every matmul reaches, an assumption; default: the GPU's "
                     "measured curve (h100, h200; a100 needs --mfu)"},
        reserve={"type": real(0.0, strict=False), "default": 0.0,
                 "help": "GiB per GPU kept for the CUDA context, NCCL and fragmentation (0)"},
        top={"type": integer(1), "default": 10, "help": "layouts to list (10)"})


def run_plan(args: argparse.Namespace) -> int:
    """Handler of ``minitrainbench plan``; ValueError (exit 2) on bad input."""
    with naming(args, "--model"):
        spec = model(args.model)
    with naming(args, "--gpus"):
        check_gpus(args.gpus)              # at once: a count with too many layouts to weigh
    with naming(args, "--cluster", "--gpus", "--gpu-memory", "--gpus-per-node"):
        gpus = cluster(args.cluster, args.gpus, args.gpu_memory, args.gpus_per_node)
    with naming(args, "--reserve", "--gpu-memory"):
        check_reserve(gpus, args.reserve * GIB)
    with naming(args, "--gpus", "--global-batch", "--seq-len"):
        result = plan(spec, gpus, args.global_batch, args.seq_len, mfu=args.mfu,
                      reserve=args.reserve * GIB)
    return emit_document(lambda: result.to_dict(top=args.top), args.json,
                         lambda: result.table(args.top), 0 if result.ranked else 1)
