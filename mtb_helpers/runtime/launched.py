"""``run`` inside a job launched by torchrun: this process is already one of the ranks.

The launcher started every rank and set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, so there
is no pool to start: ``fn`` runs here, inside the default process group (created from the
environment on first use: gloo, the backend the course's CPU tensors need), and each rank gets
the list of every rank's result, exactly as a notebook would. Output is not relayed: torchrun
already prefixes each rank's lines (``--tee 3``) or writes them to its log directory.
"""
from __future__ import annotations

import atexit
from typing import Any, Callable

import torch.distributed as dist


def run_in_launched_job(fn: Callable[..., Any], args: tuple, kwargs: dict,
                        world_size: int) -> list:
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method="env://")
        # We created the group, so we take it down: a gloo group still alive when the
        # interpreter exits can abort the process ("terminate called without an active exception").
        atexit.register(_destroy)
    actual = dist.get_world_size()
    if world_size != actual:
        raise ValueError(f"this process is a rank of a launched job of {actual} ranks, so run() "
                         f"uses those; world_size={world_size} does not match (use "
                         "mtb_helpers.runtime.ranks.resolve_world_size to ask for the job's size)")
    result = fn(*args, **kwargs)
    gathered: list = [None] * actual
    dist.all_gather_object(gathered, result)
    return gathered


def _destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
