"""Speed of the emulator against numpy's own float16 ufuncs on the same arrays.

Prints one table: ns per element and the ratio to numpy float16 in the same run
(lower is better), single-threaded, with the sticky status kept. ``typical``:
normal values times 2**u, u a uniform integer in [-6, 7]; ``overflows``: data
on which the operation overflows (add: normals x 40000, so that some operands
are already Inf; mul: normals x 300; div: normals x 1000 over normals x 0.01),
where numpy's float16 takes its slow path. The fma baseline is numpy's float16
``a * b + c`` (two roundings). Peers (gfloat, pychop) do only the rounding step
of the same work (the exact binary64 products rounded to binary16), where
installed. Targets: add/mul/div <= 0.6x on typical data, <= 0.25x on overflowing
data; every other rounding mode <= 0.6x; fma <= 1.0x.

    python bench/bench_fpu.py [--n 10000000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import functools
import os
import warnings

import numpy as np
from timing import best, print_ratios

from sim import SIX_MODES, Fpu, OverflowMode, Rounding

OPS = {"add": np.add, "mul": np.multiply, "div": np.divide}


def typical(n: int, rng: np.random.Generator) -> np.ndarray:
    return (rng.standard_normal(n) * 2.0 ** rng.integers(-6, 8, n)).astype(np.float16)


def overflowing(op: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    scale = {"add": (40000, 40000), "mul": (300, 300), "div": (1000, 0.01)}[op]
    return tuple((rng.standard_normal(n) * s).astype(np.float16) for s in scale)


def peers(a: np.ndarray, b: np.ndarray):
    """Rounding-only peers on the exact products, as callables, where installed."""
    exact = a.astype(np.float64) * b.astype(np.float64)
    found = {}
    try:
        from gfloat import RoundMode, round_ndarray
        from gfloat.formats import format_info_binary16
        found["gfloat round_ndarray"] = lambda: round_ndarray(format_info_binary16, exact, RoundMode.TiesToEven)
    except ImportError:
        pass
    try:
        from pychop import Chop
        ch = Chop(5, 10, rmode=1)
        found["pychop Chop"] = lambda: ch(exact)
    except ImportError:
        pass
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10**7)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--peer-n", type=int, default=10**5, help="elements for the (slow) peers")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    load = os.getloadavg()[0]
    rng = np.random.default_rng(0)
    n = args.n
    a, b, c = (typical(n, rng) for _ in range(3))
    Fpu().fma(a[:8], b[:8], c[:8])  # compile (or load) the kernels before timing
    rows = []

    def row(data: str, name: str, fn, baseline) -> None:
        t, tb = best(fn, args.repeat), best(baseline, args.repeat)
        rows.append((data, name, t / n * 1e9, t / tb, tb / n * 1e9))

    for op, ufunc in OPS.items():
        for ovf in OverflowMode:
            fpu = Fpu(overflow=ovf)
            row("typical", f"{op} NEAREST_EVEN {ovf.name}", functools.partial(getattr(fpu, op), a, b),
                functools.partial(ufunc, a, b))
        x, y = overflowing(op, n, rng)
        for ovf in OverflowMode:
            fpu = Fpu(overflow=ovf)
            row("overflows", f"{op} NEAREST_EVEN {ovf.name}", functools.partial(getattr(fpu, op), x, y),
                functools.partial(ufunc, x, y))
    for op, ufunc in OPS.items():
        for mode in SIX_MODES:
            if mode is not Rounding.NEAREST_EVEN:
                fpu = Fpu(rounding=mode)
                row("typical", f"{op} {mode.name}", functools.partial(getattr(fpu, op), a, b),
                    functools.partial(ufunc, a, b))
    for mode in SIX_MODES:
        row("typical", f"fma {mode.name}", functools.partial(Fpu(rounding=mode).fma, a, b, c), lambda: a * b + c)
    row("typical", "add NEAREST_EVEN +flags", functools.partial(Fpu().add, a, b, return_flags=True),
        functools.partial(np.add, a, b))
    m = min(args.peer_n, n)
    tb = best(functools.partial(np.multiply, a[:m], b[:m]), args.repeat)
    for name, fn in peers(a[:m], b[:m]).items():
        t = best(fn, 1)
        rows.append(("typical", f"{name} (rounding only, mul)", t / m * 1e9, t / tb, tb / m * 1e9))
    print(f"load average at start: {load:.2f} on {os.cpu_count()} cores")
    print_ratios(("data", "operation", "ns/elem", "x numpy f16", "numpy ns"), (11, 42), rows)


if __name__ == "__main__":
    main()
