"""Speed of the casts into the 8-bit formats against ml_dtypes' own casts on the same arrays.

Prints one table: ns per element and the ratio to ml_dtypes' ``astype`` of the same source
into the same format, in the same run (lower is better), single-threaded. The emulator's
casts return per-element IEEE flags and keep the sticky status, and saturate or not as asked;
ml_dtypes' do neither (its E4M3 overflow becomes NaN). HiFloat8 has no ml_dtypes dtype: its
rows are against the E4M3 cast. Data: normal values times 2**u, u uniform in [-8, 8], so that
some overflow E4M3 and some are subnormal. Target: binary32 -> E4M3 with flags <= 2x
ml_dtypes on 10**7 elements.

    python bench/bench_fp8.py [--n 10000000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import functools
import os
import warnings

import ml_dtypes
import numpy as np
from timing import best_of_each, print_ratios

from sim import BINARY16, BINARY32, Fpu, OverflowMode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10**7)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    load = os.getloadavg()[0]
    rng = np.random.default_rng(0)
    x32 = (rng.standard_normal(args.n) * 2.0 ** rng.integers(-8, 9, args.n)).astype(np.float32)
    x16 = x32.astype(np.float16)
    units = {"binary32": (x32, Fpu(format=BINARY32), Fpu(OverflowMode.SATURATION, format=BINARY32),
                          Fpu(format=BINARY32, rounding="stochastic")),
             "binary16": (x16, Fpu(format=BINARY16), Fpu(OverflowMode.SATURATION, format=BINARY16),
                          Fpu(format=BINARY16, rounding="stochastic"))}
    rows = []
    for src, (x, ieee, sat, sr) in units.items():
        for unit in (ieee, sat, sr):
            unit.convert(x[:16], "float8_e4m3fn", return_flags=True)  # compile (or load) before timing
            unit.convert(x[:16], "hifloat8", return_flags=True)
        cases = [
            ("float8_e4m3fn", "flags, OCP non-saturating", functools.partial(ieee.convert, x, "float8_e4m3fn",
                                                                             return_flags=True)),
            ("float8_e4m3fn", "flags, Ascend saturation", functools.partial(sat.convert, x, "float8_e4m3fn",
                                                                            return_flags=True)),
            ("float8_e4m3fn", "stochastic rounding", functools.partial(sr.convert, x, "float8_e4m3fn")),
            ("float8_e5m2", "flags, non-saturating", functools.partial(ieee.convert, x, "float8_e5m2",
                                                                       return_flags=True)),
            ("float4_e2m1fn", "flags", functools.partial(ieee.convert, x, "float4_e2m1fn", return_flags=True)),
            ("hifloat8", "flags, ties away (TA)", functools.partial(ieee.convert, x, "hifloat8", rounding="rna",
                                                                     return_flags=True)),
            ("hifloat8", "flags, hybrid (HR)", functools.partial(ieee.convert, x, "hifloat8", rounding="hybrid",
                                                                  return_flags=True)),
        ]
        for fmt, what, fn in cases:
            dtype = ml_dtypes.float8_e4m3fn if fmt == "hifloat8" else getattr(ml_dtypes, fmt)
            t, base = best_of_each([fn, functools.partial(x.astype, dtype)], args.repeat)
            rows.append((f"{src} -> {fmt}", what, t / args.n * 1e9, t / base, base / args.n * 1e9))
    print(f"load average at start: {load:.2f} on {os.cpu_count()} cores; {args.n} elements, best of {args.repeat}")
    print_ratios(("cast", "kind", "ns/elem", "x ml_dtypes", "ml_dtypes ns"), (28, 28), rows)


if __name__ == "__main__":
    main()
