"""What the check benchmarks share: the wall time of one passing check (a failing one measures
nothing, so it stops the benchmark)."""
from __future__ import annotations

import time
from typing import Callable


def timed(call: Callable[[], object]) -> float:
    """Seconds ``call()`` took; SystemExit if the report it returns did not pass."""
    start = time.perf_counter()
    report = call()
    elapsed = time.perf_counter() - start
    if not report.passed:
        raise SystemExit(f"{report.title()}: a benchmark of a failing check measures nothing")
    return elapsed
