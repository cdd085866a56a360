"""Speed of the simulated device: its matmul against numpy's float32 matmul of the same
shape (BLAS, the faster of its default threads and one thread), one small device
call, and elementwise device operations against the emulator's own (what the
register costs), and adds with normal and with subnormal results against numpy's float16
add. Ratios in one run; lower is better. Targets: matmul 256^3 with
binary32 accumulation <= 5x BLAS; a 64x32 device add <= 10 us.

    python bench/bench_device.py [--n 10000000] [--size 256] [--repeat 5]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import warnings

import numpy as np
from timing import best, best_of_each

from sim import Device, Fpu


def blas_threads(n: int | None):
    """A context limiting BLAS to n threads (threadpoolctl, where installed); None: as it is."""
    if n is None:
        return contextlib.nullcontext()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(n, user_api="blas")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10**7)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    load = os.getloadavg()[0]
    rng = np.random.default_rng(0)
    rows = []
    s = args.size
    a, b = (rng.standard_normal((s, s)).astype(np.float16) for _ in range(2))
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    devices = {"1 thread": Device("atlas-a2"), "2 threads": Device("atlas-a2", threads=2)}
    for dev in devices.values():
        dev.matmul(a[:2], b[:, :2])  # compile (or load) the kernels
    repeat = max(args.repeat, 20)
    # Ours in turn with BLAS on one thread (a slow spell of the machine falls on all alike),
    # then BLAS on its default threads (its idle workers spin for a while after each call).
    calls = [functools.partial(dev.matmul, a, b) for dev in devices.values()]
    blas = {}
    limit = blas_threads(1)
    if limit is not None:
        with limit:
            *ours, blas["1 thread"] = best_of_each([*calls, lambda: a32 @ b32], repeat)
    else:
        ours = best_of_each(calls, repeat)
    timings = dict(zip(devices, ours, strict=True))
    blas["default threads"] = best(lambda: a32 @ b32, repeat)
    label, base = min(blas.items(), key=lambda kv: kv[1])
    for name, t in timings.items():
        rows.append((f"matmul {s}^3 f32 acc, device {name} (ms)", t * 1e3, t / base,
                     f"numpy f32 matmul, {label} (ms)", base * 1e3))

    small = np.ones((64, 32), np.float16)
    dev = Device("atlas-a2")
    dev.add(small, small)
    t, tb = best_of_each([functools.partial(dev.add, small, small), functools.partial(np.add, small, small)], 5000)
    rows.append(("device add 64x32 (us)", t * 1e6, t / tb, "numpy f16 add 64x32 (us)", tb * 1e6))

    x, y = (rng.standard_normal(args.n).astype(np.float16) for _ in range(2))
    for profile in ("atlas-a2", "atlas-training"):
        dev = Device(profile)
        fpu = Fpu(dev.overflow)
        for op in ("add", "mul"):
            ref = best(functools.partial(getattr(fpu, op), x, y), args.repeat)
            t = best(functools.partial(getattr(dev, op), x, y), args.repeat)
            rows.append((f"device {op} 1e{len(str(args.n)) - 1}, {profile} (ms)", t * 1e3, t / ref, f"Fpu.{op} (ms)",
                         ref * 1e3))
    # Gradients in float16 are often subnormal: results below 2**-14 against numpy's float16 add.
    dev = Device("atlas-training")
    for name, scale in (("normal", 1.0), ("subnormal", 2.0**-20)):
        u, v = (x * np.float16(scale)).astype(np.float16), (y * np.float16(scale)).astype(np.float16)
        t, tn = best_of_each([functools.partial(dev.add, u, v), functools.partial(np.add, u, v)], args.repeat)
        rows.append((f"device add 1e{len(str(args.n)) - 1}, {name} results (ms)", t * 1e3, t / tn,
                     "numpy f16 add (ms)", tn * 1e3))
    print(f"load average at start: {load:.2f} on {os.cpu_count()} cores; BLAS timed: {', '.join(blas)}")
    print(f"{'operation':<44}{'time':>9}{'ratio':>8}   baseline (time)")
    for name, ms, ratio, against, base_ms in rows:
        print(f"{name:<44}{ms:>9.3f}{ratio:>8.2f}   {against} ({base_ms:.3f})")


if __name__ == "__main__":
    main()
