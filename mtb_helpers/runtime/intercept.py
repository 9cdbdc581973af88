"""The one place a rank's ``torch.distributed`` calls are observed: records and emulated links.

While something observes them, the public collective and point-to-point functions of
``torch.distributed`` (and of ``distributed_c10d``, so ``P2POp``, ``batch_isend_irecv`` and the
object collectives use them too) are replaced by wrappers that hand each call to the active hooks,
outermost first, and end in the function that was in place before (torch's own, or whatever a
test put there). A hook is ``hook(name, call, args, kwargs)``: it may look at the call, time it,
or run it differently, and must call ``call(*args, **kwargs)`` (or something doing the same work)
to go on. Two hooks exist: the emulated link (``link_ops``, innermost: it decides when the real op
runs) and the record of collectives (``comm/records.py``, outermost). With no hook active the
functions are torch's own, untouched: observing costs nothing when nobody observes.

A lesson calls ``dist.all_reduce(x, group=group)`` itself; a student's code is observed the
same way as the course's. The runtime's own traffic (an emulated link's agreement of the ranks)
calls ``ORIG``, torch's functions as imported, and is neither recorded nor emulated.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

__all__ = ["NAMES", "ORIG", "signature", "add_hook"]

Hook = Callable[[str, Callable, tuple, dict], Any]

COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
               "all_gather_single", "reduce_scatter", "reduce_scatter_tensor",
               "reduce_scatter_single", "all_to_all", "all_to_all_single", "gather", "scatter",
               "barrier")
P2P = ("send", "recv", "isend", "irecv")
DRAINED = ("monitored_barrier",)   # an emulated link only lets its stream drain first
NAMES = tuple(n for n in (*COLLECTIVES, *P2P, *DRAINED) if hasattr(c10d, n))
ORIG: dict[str, Callable] = {n: getattr(c10d, n) for n in NAMES}
_SIGNATURES: dict[str, inspect.Signature] = {}

_HOOKS: list[tuple[int, Hook]] = []   # (depth, hook): the smallest depth runs closest to torch
_saved: list[tuple[Any, str, Callable]] = []   # what the wrappers replaced, to put back


def signature(name: str) -> inspect.Signature:
    """The signature of torch's ``name`` (to bind a call's arguments by name), computed once."""
    if name not in _SIGNATURES:
        _SIGNATURES[name] = inspect.signature(ORIG[name])
    return _SIGNATURES[name]


def _wrapper(name: str, inner: Callable) -> Callable:
    def op(*args, **kwargs):
        call = inner
        for _, hook in _HOOKS:   # innermost first, so the last one added wraps the others
            call = _chained(hook, name, call)
        return call(*args, **kwargs)

    # a blocked rank's stack dump then names the collective, as torch's own function would
    op.__code__ = op.__code__.replace(co_name=name, co_qualname=name)
    op.__name__ = op.__qualname__ = name
    op.__wrapped__ = inner
    return op


def _chained(hook: Hook, name: str, call: Callable) -> Callable:
    return lambda *args, **kwargs: hook(name, call, args, kwargs)


def add_hook(hook: Hook, depth: int) -> Callable[[], None]:
    """Observe every call of ``NAMES`` with ``hook`` until the returned ``remove()`` is called.
    ``depth``: hooks run in order of decreasing depth (the largest wraps the others). The first
    hook puts the wrappers in place; removing the last puts torch's functions back."""
    if not _HOOKS:
        _saved[:] = [(m, n, getattr(m, n)) for m in (dist, c10d) for n in NAMES if hasattr(m, n)]
        wrappers: dict[int, Callable] = {}   # one wrapper per function: dist.isend is c10d.isend
        for module, name, inner in _saved:
            setattr(module, name, wrappers.setdefault(id(inner), _wrapper(name, inner)))
    entry = (depth, hook)
    _HOOKS.append(entry)
    _HOOKS.sort(key=lambda e: e[0])

    def remove() -> None:
        _HOOKS.remove(entry)
        if not _HOOKS:
            for module, name, fn in _saved:
                setattr(module, name, fn)
            _saved.clear()

    return remove
