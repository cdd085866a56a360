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


def best_of_each(fns: list[Callable[[], object]], repeat: int) -> list[float]:
    """The fastest of ``repeat`` runs of each of ``fns``, run in turn, so that a slow spell of a
    shared machine falls on all of them alike (ratios between them stay fair)."""
    fastest = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            fastest[i] = min(fastest[i], time.perf_counter() - t0)
    return fastest
