"""Speed of the emulator against numpy's own float16 ufuncs on the same arrays.

Prints one table: ns per element and the ratio to numpy float16 (lower is
better). ``typical``: normal values times 2**u, u uniform in [-6, 7] (almost no
overflow); ``overflow-heavy``: normal values times 300 (numpy's float16 slow
path). The status register is kept (no per-element flags) unless a row says
``+flags``. The fma baseline is numpy's float16 ``a * b + c`` (two roundings).
Peers (gfloat, pychop) do only the rounding step of the same work (the exact
binary64 result rounded to binary16), where installed.

    python bench/bench_fpu.py [--n 10000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import functools
import warnings

import numpy as np
from timing import best

from sim import Fpu, OverflowMode, Rounding


def data(kind: str, n: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(3):
        x = rng.standard_normal(n)
        x = x * 2.0 ** rng.integers(-6, 8, n) if kind == "typical" else x * 300
        out.append(x.astype(np.float16))
    return tuple(out)




def numpy_baseline(op: str, a, b, c):
    return {"add": lambda: a + b, "mul": lambda: a * b, "div": lambda: a / b, "fma": lambda: a * b + c}[op]


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
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--peer-n", type=int, default=10**5, help="elements for the (slow) peers")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    rows = []
    for kind in ("typical", "overflow-heavy"):
        a, b, c = data(kind, args.n, 0)
        cases = [(op, mode, ovf, False) for op in ("add", "mul", "div")
                 for ovf in (OverflowMode.INF_NAN, OverflowMode.SATURATION)
                 for mode in (Rounding.NEAREST_EVEN,)]
        cases += [("add", Rounding.NEAREST_EVEN, OverflowMode.INF_NAN, True)]
        if kind == "typical":
            cases += [(op, mode, OverflowMode.INF_NAN, False) for op in ("add", "mul", "div")
                      for mode in Rounding if mode is not Rounding.NEAREST_EVEN]
            cases += [("fma", mode, OverflowMode.INF_NAN, False) for mode in Rounding]
        base = {}
        for op, mode, ovf, flags in cases:
            if op not in base:
                base[op] = best(numpy_baseline(op, a, b, c), args.repeat)
            fpu = Fpu(overflow=ovf, rounding=mode)
            operands = (a, b, c) if op == "fma" else (a, b)
            t = best(functools.partial(getattr(fpu, op), *operands, return_flags=flags), args.repeat)
            name = f"{op} {mode.name} {ovf.name}" + (" +flags" if flags else "")
            rows.append((kind, name, t / args.n * 1e9, t / base[op], base[op] / args.n * 1e9))
        m = min(args.peer_n, args.n)
        for name, fn in peers(a[:m], b[:m]).items():
            t = best(fn, 1)
            rows.append((kind, f"{name} (rounding only, mul)", t / m * 1e9, t / m / (base["mul"] / args.n), None))
    print(f"{'data':<15}{'operation':<44}{'ns/elem':>9}{'x numpy f16':>13}{'numpy ns':>10}")
    for kind, name, ns, ratio, np_ns in rows:
        extra = f"{np_ns:>10.2f}" if np_ns is not None else ""
        print(f"{kind:<15}{name:<44}{ns:>9.2f}{ratio:>13.2f}{extra}")


if __name__ == "__main__":
    main()
