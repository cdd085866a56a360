"""A statistics-only dump set against the device's: the same script's dump made on a simulated device
(``collected_on_host``), its tensors' Max, Min, Mean and Norm beside the dumped ones, differences
and relative differences as msprobe's compare computes them in its statistics mode.

From mindstudio-probe 26.2 (``msprobe/core/compare/acc_compare.py``, ``calc_summary_diff`` and its
rules): per statistic, 0 and 0 where both sides are equal (infinities too); else the difference
target - bench and the relative difference |difference / bench| * 100 in percent (+Inf where bench
is 0); an infinity on one side gives that signed infinity (target's, or bench's negated) for both;
a NaN or a missing value gives neither (None). The target here is the device's dump, the bench the
dump given (a card's, or the CPU's).
"""

from __future__ import annotations

import math
from typing import Any

from .dump import Entry, recorded

__all__: list[str] = []  # public as lossscale.msprobe's

#: The statistics, as dump.json and msprobe's compare name them.
STATISTICS = {"max": ("Max", "Max diff", "MaxRelativeErr"), "min": ("Min", "Min diff", "MinRelativeErr"),
              "mean": ("Mean", "Mean diff", "MeanRelativeErr"), "norm": ("Norm", "L2norm diff", "NormRelativeErr")}


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _difference(t: Any, b: Any) -> tuple[float | None, float | None]:
    """msprobe's difference and relative difference (percent) of a target and a bench statistic."""
    if not (_number(t) and _number(b)) or math.isnan(t) or math.isnan(b):
        return None, None  # N/A, or NaN
    if t == b:
        return 0.0, 0.0
    if math.isinf(t) or math.isinf(b):  # the sign of the infinite difference, for both
        inf = math.copysign(math.inf, t if math.isinf(t) else -b)
        return inf, inf
    diff = t - b
    return diff, abs(diff / b * 100) if b != 0 else math.inf


def _summarised(entry: Entry) -> dict[str, dict]:
    """An entry's records that carry statistics (msprobe's summaries), by msprobe's names."""
    return {name: meta for name, _, meta in recorded(entry) if "Max" in meta}


def statistics(dumped: list[Entry], device: list[Entry]) -> list[dict[str, Any]]:
    """Each tensor of ``dumped`` that the device's dump of the same run also holds (same step,
    rank, call and position): both sides' statistics, their differences and relative differences
    in percent (see the module's docstring; None where msprobe prints N/A or NaN)."""
    theirs = {(e.step, e.rank): {} for e in device}
    for e in device:
        theirs[e.step, e.rank].update(_summarised(e))
    rows = []
    for e in dumped:
        mine = theirs.get((e.step, e.rank), {})
        for name, bench in _summarised(e).items():
            target = mine.get(name)
            if target is None:
                continue
            row: dict[str, Any] = {"step": e.step, "rank": e.rank, "tensor": name, "module": e.module}
            for stat, (key, _, _) in STATISTICS.items():
                t, b = target.get(key), bench.get(key)
                row[f"device_{stat}"], row[f"dumped_{stat}"] = t, b
                diff, rel = _difference(t, b)
                row[f"{stat}_diff"], row[f"{stat}_rel_percent"] = diff, rel
            rows.append(row)
    return rows
