"""Shared by the benchmark scripts: the best of several wall-clock timings, and the table of
a timed step against its baseline."""

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


def print_steps(title: str, baseline: tuple[str, float], steps: list[tuple[str, float]]) -> None:
    """A table of step times in ms, each with its ratio to ``baseline`` (its name and seconds),
    which comes first."""
    rows = [baseline, *steps]
    width = max(len(title), *(len(name) for name, _ in rows)) + 2
    print(f"{title:<{width}}{'ms':>9}{'ratio':>8}")
    for name, seconds in rows:
        print(f"{name:<{width}}{seconds * 1e3:>9.3f}{seconds / baseline[1]:>8.2f}")


def print_ratios(columns: tuple[str, str, str, str, str], widths: tuple[int, int], rows) -> None:
    """A table of (group, name, ns per element, ratio to the baseline, the baseline's ns) rows
    under ``columns``; ``widths``: those of the two text columns."""
    a, b = widths
    names = columns[2:]
    print(f"{columns[0]:<{a}}{columns[1]:<{b}}" + "".join(f"{c:>{max(len(c) + 2, 9)}}" for c in names))
    for group, name, ns, ratio, base in rows:
        cells = zip((ns, ratio, base), names, strict=True)
        print(f"{group:<{a}}{name:<{b}}" + "".join(f"{v:>{max(len(c) + 2, 9)}.2f}" for v, c in cells))
