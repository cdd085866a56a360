"""``python -m sim``: the emulator at work, the same operations in both overflow modes."""

from __future__ import annotations

import numpy as np

from . import Flag, Fpu, OverflowMode

CASES = [
    ("mul", (300.0, 300.0)),
    ("add", (65504.0, 16.0)),
    ("mul", (2.0**-12, 2.0**-14)),
    ("div", (1.0, 0.0)),
    ("sub", (np.inf, np.inf)),
    ("sqrt", (-1.0,)),
    ("div", (1.0, 3.0)),
]


def flag_names(bits: int) -> str:
    return "|".join(f.name for f in Flag if bits & f) or "-"


def main() -> None:
    fpus = {mode: Fpu(overflow=mode) for mode in (OverflowMode.INF_NAN, OverflowMode.SATURATION)}
    print(f"{'operation':<30}{'INF_NAN':>14}{'SATURATION':>14}   flags (IEEE, both modes)")
    for op, args in CASES:
        xs = [np.float16(a) for a in args]
        results = [getattr(fpu, op)(*xs, return_flags=True) for fpu in fpus.values()]
        text = f"{op}({', '.join(f'{float(x):g}' for x in xs)})"
        values = "".join(f"{float(v):>14.9g}" for v, _ in results)
        print(f"{text:<30}{values}   {flag_names(int(results[0][1]))}")
    for mode, fpu in fpus.items():
        print(f"sticky status, {mode.name}: {fpu.status!r}")


if __name__ == "__main__":
    main()
