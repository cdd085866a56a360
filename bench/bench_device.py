"""Speed of the simulated device: its matmul against numpy's float32 matmul of
the same shape, and its elementwise operations against the emulator's own
(what the float-status register costs). Ratios in one run; lower is better.

    python bench/bench_device.py [--n 10000000] [--size 256] [--repeat 3]
"""

from __future__ import annotations

import argparse
import functools
import warnings

import numpy as np
from timing import best

from sim import Device, Fpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10**7)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    rng = np.random.default_rng(0)
    rows = []
    s = args.size
    a, b = (rng.standard_normal((s, s)).astype(np.float16) for _ in range(2))
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    # Ours first: OpenBLAS worker threads keep spinning for a while after a
    # call and would take the cores from the device's matmul threads.
    timings = {p: best(functools.partial(Device(p).matmul, a, b), max(args.repeat, 20))
               for p in ("atlas-a2", "atlas-training")}
    base = best(lambda: a32 @ b32, max(args.repeat, 20))
    for profile, t in timings.items():
        rows.append((f"matmul {s}x{s}x{s} f32 acc, {profile}", t * 1e3, t / base, "numpy float32 matmul", base * 1e3))
    x, y = (rng.standard_normal(args.n).astype(np.float16) for _ in range(2))
    for profile in ("atlas-a2", "atlas-training"):
        dev = Device(profile)
        fpu = Fpu(dev.overflow)
        for op in ("add", "mul"):
            ref = best(functools.partial(getattr(fpu, op), x, y), args.repeat)
            t = best(functools.partial(getattr(dev, op), x, y), args.repeat)
            rows.append((f"device {op} 1e{len(str(args.n)) - 1}, {profile}", t * 1e3, t / ref, f"Fpu.{op}", ref * 1e3))
    print(f"{'operation':<40}{'ms':>9}{'ratio':>8}   baseline (ms)")
    for name, ms, ratio, against, base_ms in rows:
        print(f"{name:<40}{ms:>9.2f}{ratio:>8.2f}   {against} ({base_ms:.2f})")


if __name__ == "__main__":
    main()
