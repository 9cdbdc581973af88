"""The private PyTorch names the course uses outside the ranks' machinery, each behind one function.

PyTorch does not promise these names; torch 2.13 has them (``tests/test_compat.py`` fails naming
the one a release removed). Where a public API gives the same answer it is the fallback; where
none exists the function raises ``PrivateAPIMissing`` naming the private name, so a comparison
says what moved instead of failing somewhere inside torch. Together with ``mp_private.py`` (the
private parts of ``multiprocessing``) this is the one guarded place for private names.
Each is named in ``PRIVATE_NAMES`` and read by one function below.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch.distributed as dist

__all__ = ["PRIVATE_NAMES", "PrivateAPIMissing", "zero_partition", "pytorch_ring",
           "dispatch_mode"]

RING_MODULE = "torch.distributed.tensor.experimental._context_parallel._attention"
DISPATCH_MODULE = "torch.utils._python_dispatch"
# {where: names} of every private name this module reads; tests/test_compat.py checks each
PRIVATE_NAMES: dict[str, tuple[str, ...]] = {
    "torch.distributed.optim.ZeroRedundancyOptimizer": ("_partition_parameters",),
    RING_MODULE: ("_templated_ring_attention", "_templated_ring_attention_backward",
                  "_cp_options", "_RotateMethod"),
    DISPATCH_MODULE: ("TorchDispatchMode",),
}


class PrivateAPIMissing(RuntimeError):
    """A private PyTorch name the course needs, with no public equivalent, is gone."""


def zero_partition(zero: Any, index: dict) -> list[list[int]]:
    """``ZeroRedundancyOptimizer``'s partition: for each rank, the indices (``index[param]``) of
    the parameters it steps. Without the private ``_partition_parameters`` each rank reads its
    own ``zero.optim.param_groups`` and the ranks all-gather them (a collective: every rank of
    ``zero.process_group`` must call this then)."""
    private = getattr(zero, "_partition_parameters", None)
    if private is not None:
        return [[index[p] for g in groups for p in g["params"]] for groups in private()]
    mine = [index[p] for g in zero.optim.param_groups for p in g["params"]]
    everyone: list = [None] * dist.get_world_size(zero.process_group)
    dist.all_gather_object(everyone, mine, group=zero.process_group)
    return everyone


def _private_module(name: str, what: str) -> Any:
    """torch's private module ``name`` with every name PRIVATE_NAMES lists for it, or
    PrivateAPIMissing naming what is gone and what cannot be done without it."""
    import importlib
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        raise PrivateAPIMissing(f"{name} is gone from torch: {what}") from exc
    missing = [n for n in PRIVATE_NAMES[name] if not hasattr(module, n)]
    if missing:
        raise PrivateAPIMissing(f"{name} no longer has {', '.join(missing)}: {what}")
    return module


def dispatch_mode() -> type:
    """``TorchDispatchMode``, the base class of a mode that sees every aten op a rank runs (the
    pipeline comparison counts PyTorch's sends and receives with one)."""
    return _private_module(DISPATCH_MODULE, "PyTorch's point-to-point ops cannot be counted "
                                            "here").TorchDispatchMode


@contextlib.contextmanager
def pytorch_ring(load_balance: bool) -> Iterator[tuple[Callable, Callable]]:
    """PyTorch's private ring attention ``(forward, backward)`` (``_templated_ring_attention`` and
    its backward), with its module-wide options set for the course's comparison while the block
    runs and restored afterwards: zigzag load balance if ``load_balance``, merges in the inputs'
    dtype (fp64 stays exact), K/V passed one hop per step (the ring)."""
    A = _private_module(RING_MODULE, "PyTorch's ring attention cannot be compared here")
    options = A._cp_options
    saved = (options.enable_load_balance, options.convert_to_f32, options.rotate_method)
    try:
        options.enable_load_balance = load_balance
        options.convert_to_f32 = False
        options.rotate_method = A._RotateMethod.ALL_TO_ALL
        yield A._templated_ring_attention, A._templated_ring_attention_backward
    finally:
        options.enable_load_balance, options.convert_to_f32, options.rotate_method = saved
