"""The overflow verdict without the card: per step and rank, the first call that made a non-finite
value out of finite inputs, and on which products and overflow modes a simulated device makes it
too (msprobe's overflow check asks one question of one card: "normal", it overflows on the CPU
too, or "abnormal"; this asks it of every product)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from .dump import Entry, recorded
from .replay import replay

__all__: list[str] = []  # public as lossscale.msprobe's


def _bad(meta: Any) -> bool:
    """A dumped tensor that holds Inf or NaN (its Max or Min not finite; its Norm alone may overflow
    in the tensor's own dtype), or, in binary16, +-65504 (what saturation mode makes of an
    overflow)."""
    if not (isinstance(meta, dict) and meta.get("type") == "torch.Tensor"):
        return False
    ends = [meta.get("Max"), meta.get("Min")]
    if any(not isinstance(v, (int, float)) or not np.isfinite(v) for v in ends if v is not None):
        return True
    return meta.get("dtype") == "torch.float16" and any(v is not None and abs(v) == 65504.0 for v in ends)


def verdict(entries: list[Entry], profiles: list[str] | None = None) -> list[dict[str, Any]]:
    """Per step and rank, the first producer of a non-finite (or, in binary16, +-65504) value: the
    first call (forward or backward), in the dump's order, whose input tensors (and parameters) were all finite
    and one of whose outputs is not, read from the dumped statistics (a statistics or md5 dump
    serves too); its module path and source line; how many calls after it only carried such a value
    on (a bad input, a bad output); and, where the dump holds its tensors, whether a simulated
    device reproduces it on each profile in each of its overflow modes (INF/NaN mode: a non-finite
    output; saturation mode: a register event; None: it could not be re-executed). One row per step
    and rank that has one."""
    from sim import profiles as sim_profiles
    names = profiles or sim_profiles.names()
    rows = []
    for key in dict.fromkeys((e.step, e.rank) for e in entries):
        first, carried = None, 0
        for e in (e for e in entries if (e.step, e.rank) == key and e.direction != "parameters_grad"):
            bad = {part for _, part, meta in recorded(e) if _bad(meta)}
            bad_in, bad_out = bool(bad - {"output"}), "output" in bad
            if bad_out and not bad_in and first is None:
                first = e
            elif bad_out and bad_in:
                carried += 1
        if first is None:
            continue
        row: dict[str, Any] = {"step": key[0], "rank": key[1], "api": first.name, "module": first.module,
                               "source": first.source, "carried_by": carried}
        for name in names:
            for mode in sim_profiles.get(name).overflow_modes:
                row[f"{name}/{mode.name.lower()}"] = _reproduced(first, name, mode.name.lower())
        rows.append(row)
    return rows


def _reproduced(entry: Entry, profile: str, mode: str) -> bool | None:
    """Whether the device reproduces the entry's overflow (None: it could not be re-executed)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a legacy saturation mode is asked for on purpose
        rows = replay([entry], profile, mode)
    if rows[0]["events"] is None:
        return None
    if mode == "saturation":
        return rows[0]["events"] > 0
    return any(bool(r["nonfinite"]) for r in rows)
