"""Speed of the casts into the 8-bit formats against ml_dtypes' own casts on the same arrays.

Prints one table: ns per element and the ratio to ml_dtypes' ``astype`` of the same source
into the same format, in the same run (lower is better), single-threaded. The emulator's
casts return per-element IEEE flags and keep the sticky status, and saturate or not as asked;
ml_dtypes' do neither (its E4M3 overflow becomes NaN). HiFloat8 has no ml_dtypes dtype: its
rows are against the E4M3 cast; E1M2 and HiFloat4's element have none either: theirs are against
the E2M1 cast. A second table times block quantisation (MX, NVFP4, HiF4, block FP8) per element,
against torchao's emulation (``to_mx``, ``nvfp4_quantize``, on the CPU, one thread) where it has
the same quantiser and torchao is installed. Data: normal values times 2**u, u uniform in [-8, 8], so that
some overflow E4M3 and some are subnormal. Target: every deterministic cast with flags at most
1x ml_dtypes on 10**7 elements (they read the rounding routine's tables: ``sim.fpu.Fpu._lookup``).

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
            ("float4_e1m2fn", "flags (vs E2M1)", functools.partial(ieee.convert, x, "float4_e1m2fn",
                                                                  return_flags=True)),
            ("hifloat4", "flags (vs E2M1)", functools.partial(ieee.convert, x, "hifloat4", return_flags=True)),
            ("hifloat8", "flags, ties away (TA)", functools.partial(ieee.convert, x, "hifloat8", rounding="rna",
                                                                     return_flags=True)),
            ("hifloat8", "flags, hybrid (HR)", functools.partial(ieee.convert, x, "hifloat8", rounding="hybrid",
                                                                  return_flags=True)),
        ]
        for fmt, what, fn in cases:
            dtype = {"hifloat8": ml_dtypes.float8_e4m3fn, "float4_e1m2fn": ml_dtypes.float4_e2m1fn,
                     "hifloat4": ml_dtypes.float4_e2m1fn}.get(fmt) or getattr(ml_dtypes, fmt)
            t, base = best_of_each([fn, functools.partial(x.astype, dtype)], args.repeat)
            rows.append((f"{src} -> {fmt}", what, t / args.n * 1e9, t / base, base / args.n * 1e9))
    print(f"load average at start: {load:.2f} on {os.cpu_count()} cores; {args.n} elements, best of {args.repeat}")
    print_ratios(("cast", "kind", "ns/elem", "x ml_dtypes", "ml_dtypes ns"), (28, 28), rows)
    print()
    blocks(x32[: args.n - args.n % 1024].reshape(-1, 1024), args.repeat)


def blocks(x: np.ndarray, repeat: int) -> None:
    """Block quantisation per element, against torchao's emulation of the same quantiser."""
    from sim import blockfp8, hif4, mx, nvfp4

    try:
        import torch
        from torchao.prototype.mx_formats import nvfp4_tensor
        from torchao.prototype.mx_formats.mx_tensor import to_mx
        torch.set_num_threads(1)
        t = torch.from_numpy(x)
        peers = {"MX E4M3 (floor)": lambda: to_mx(t, torch.float8_e4m3fn, 32),
                 "NVFP4 (two-level)": lambda: nvfp4_tensor.nvfp4_quantize(
                     t, 16, nvfp4_tensor.per_tensor_amax_to_scale(t.abs().max()))}
    except ImportError:
        peers = {}
    ours = {"MX E4M3 (floor)": lambda: mx.quantize(x, "float8_e4m3fn"), "NVFP4 (two-level)": lambda: nvfp4.quantize(x),
            "HiF4": lambda: hif4.quantize(x), "block FP8 (1x128, pow2)": lambda: blockfp8.quantize(x)}
    rows = []
    for name, fn in ours.items():
        fn()  # compile (or load) before timing
        if name in peers:
            took, base = best_of_each([fn, peers[name]], repeat)
            rows.append((name, "torchao", took / x.size * 1e9, took / base, base / x.size * 1e9))
        else:
            took, = best_of_each([fn], repeat)
            rows.append((name, "(no peer)", took / x.size * 1e9, float("nan"), float("nan")))
    print(f"block quantisation of {x.size} binary32 values, best of {repeat}")
    print_ratios(("quantiser", "peer", "ns/elem", "x peer", "peer ns"), (28, 12), rows)


if __name__ == "__main__":
    main()
