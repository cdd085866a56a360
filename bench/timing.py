"""Shared by the benchmark scripts: the best of several wall-clock timings."""

from __future__ import annotations

import time
from collections.abc import Callable


def best(fn: Callable[[], object], repeat: int) -> float:
    """The fastest of ``repeat`` runs of ``fn``, in seconds (the least disturbed by the machine)."""
    fastest = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        fastest = min(fastest, time.perf_counter() - t0)
    return fastest
