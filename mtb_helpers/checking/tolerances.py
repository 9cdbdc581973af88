"""Dtypes and tolerances, stated once for every check.

A check runs in float32 or float64 (``as_dtype`` accepts the names the CLI passes too). A row
passes when ``max|got - ref| <= atol + rtol * max|ref|`` with (rtol, atol) from ``TOLERANCES``;
``ulp`` gives the spacing of the dtype at a value, so reports can say "3 ulps" instead of "3e-7".
"""
from __future__ import annotations

import math
from typing import Callable

import torch

__all__ = ["TOLERANCES", "ulp", "tolerance", "as_dtype", "check_config", "number", "positive_sizes",
           "divisible"]

# Loose enough for any summation order at these sizes (those errors are a few ulps; 1e-5 of the
# largest value is about a hundred float32 ulps), tight enough that every deliberate bug (errors
# of order 1) fails by orders of magnitude.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-6),
    torch.float64: (1e-12, 1e-14),
}


def ulp(value: float, dtype: torch.dtype) -> float:
    """The spacing of ``dtype`` at ``|value|`` (its unit in the last place)."""
    v = torch.tensor(abs(value), dtype=dtype)
    return float(torch.nextafter(v, torch.tensor(math.inf, dtype=dtype)) - v)


def tolerance(ref: torch.Tensor, dtype: torch.dtype) -> float:
    rtol, atol = TOLERANCES[dtype]
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    return atol + rtol * scale


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``torch.float32`` / ``torch.float64`` from the dtype or its name; anything else is refused."""
    named = {"float32": torch.float32, "float64": torch.float64}
    dtype = named.get(dtype, dtype) if isinstance(dtype, str) else dtype
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}")
    return dtype


def check_config(t: int, dtype: torch.dtype, seed: int, bug: str | None, **extra) -> dict:
    """The ``config`` dict every Report carries: world size, the check's sizes, dtype, seed, bug."""
    return {"world_size": t, **extra, "dtype": str(dtype).replace("torch.", ""), "seed": seed,
            "bug": bug}


def number(name: str, value, holds: Callable[[float], bool], want: str,
           integral: bool = False) -> None:
    """Refuse (ValueError naming it: ``"{name} must be {want}, got {value!r}"``) a ``value`` that
    is not an int or float (an int when ``integral``; a bool is neither) or fails ``holds``."""
    kinds = int if integral else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not holds(value):
        raise ValueError(f"{name} must be {want}, got {value!r}")


def positive_sizes(**dims: int) -> None:
    """Refuse (ValueError naming it) any size that is not a positive integer."""
    for name, size in dims.items():
        number(name, size, lambda n: n >= 1, "a positive integer", integral=True)


def divisible(name: str, size: int, by: str, n: int, why: str) -> None:
    """Refuse (ValueError) a ``size`` that ``n`` (``by`` names it, e.g. "the world size 4") does
    not divide, saying ``why`` it must."""
    if size % n:
        raise ValueError(f"{name}={size} is not divisible by {by}: {why}")
