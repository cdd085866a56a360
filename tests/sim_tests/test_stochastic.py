"""Stochastic rounding: unbiased within its statistical bound in every format, the bias of K
random bits as predicted, reproducible bit for bit under a seed, and element i's bits a
function of the seed, the operation's sequence number and i alone."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim import BFLOAT16, BINARY16, BINARY32, Device, Flag, Fpu, Rounding, formats

from oracle import reference8

N = 200_000


def _values(codes: np.ndarray, fmt_name: str) -> np.ndarray:
    if fmt_name in ("binary16", "bfloat16"):
        return codes.astype(np.float64)
    return formats.decode(codes, fmt_name)


def _neighbours(x: float, fmt_name: str) -> tuple[float, float]:
    if fmt_name in ("binary16", "bfloat16"):
        dt = np.float16 if fmt_name == "binary16" else formats.BFLOAT16.dtype
        lo = float(Fpu(rounding="rtz", format=BINARY32).convert(np.float32(x), dt))
        hi = float(Fpu(rounding="ceil", format=BINARY32).convert(np.float32(x), dt))
        return lo, hi
    fmt = formats.format_of(fmt_name)
    return reference8(x, fmt, Rounding.TOWARD_ZERO)[0], reference8(x, fmt, Rounding.UPWARD)[0]


# Values at the hard places: just above a grid point, just below the next, near a binade's top
# (the carry), in subnormals, and for HiFloat8 in its tapered binades.
CASES = [
    ("float8_e4m3fn", 1.0 + 1 / 64), ("float8_e4m3fn", 1.125 - 2**-20), ("float8_e4m3fn", 1.95),
    ("float8_e4m3fn", 3 * 2.0**-10), ("float8_e5m2", 1.3), ("float8_e5m2", 50000.0),
    ("float6_e3m2fn", 0.3), ("float6_e3m2fn", 21.0), ("float6_e3m2fn", 0.1), ("float6_e2m3fn", 0.3),
    ("float6_e2m3fn", 6.9), ("float6_e2m3fn", 0.06),
    ("float4_e2m1fn", 0.3), ("float4_e2m1fn", 5.0), ("hifloat8", 1.01), ("hifloat8", 300.0),
    ("hifloat8", 20000.0), ("hifloat8", 3 * 2.0**-21), ("bfloat16", 1.0 + 2**-9), ("binary16", 1.0 + 2**-13),
    # below half the finest quantum: rounds up with the value's own (small) odds, not never
    ("float8_e4m3fn", 2.0**-11), ("float8_e4m3fn", 2.0**-12), ("binary16", 2.0**-26), ("hifloat8", 2.0**-24),
    # and 4/3, between two grid points of every format with a fraction bit, in each signed format
    # of the catalogue (a format added there is tested without a line here)
    *[(f.name, 4 / 3) for f in (*formats.EIGHT_BIT, BINARY16, BFLOAT16) if f.signed],
]


@pytest.mark.parametrize(("fmt", "x"), CASES)
def test_mean_is_unbiased(fmt: str, x: float) -> None:
    fpu = Fpu(rounding="stochastic", format=BINARY32, seed=7)
    dst = formats.format_of(fmt)
    codes, flags = fpu.convert(np.full(N, x, np.float32), dst.dtype if dst.dtype != np.uint8 else dst.name,
                               return_flags=True)
    got = _values(codes, fmt)
    x = float(np.float32(x))
    lo, hi = _neighbours(x, fmt)
    assert set(np.unique(got)) <= {lo, hi} and np.unique(got).size == 2  # both neighbours, and only they
    p = (x - lo) / (hi - lo)
    bound = 5 * math.sqrt(p * (1 - p) / N) * (hi - lo)  # five standard errors of the mean
    assert abs(got.mean() - x) <= bound, (got.mean(), x, bound)
    assert np.all(flags & Flag.INEXACT)


@pytest.mark.parametrize("bits", [1, 3, 6])
def test_few_random_bits_truncate_the_probability(bits: int) -> None:
    """With K random bits the probability of rounding up is the dropped fraction truncated to K
    bits: exactly predictable, the bias hardware with K random bits has."""
    x = 1 + 0.8 / 8  # 0.8 of the way from 1 to 1.125 in E4M3
    fpu = Fpu(rounding="stochastic", format=BINARY32, seed=3, random_bits=bits)
    got = fpu.convert(np.full(N, x, np.float32), "float8_e4m3fn").astype(np.float64)
    frac = (float(np.float32(x)) - 1) * 8
    p = math.floor(frac * 2**bits) / 2**bits
    assert abs((got == 1.125).mean() - p) <= 5 * math.sqrt(max(p * (1 - p), 1e-12) / N) + 1e-12


def test_arithmetic_rounds_stochastically_without_bias() -> None:
    fpu = Fpu(rounding="stochastic", seed=11)
    a = np.full(N, 1.0, np.float16)
    b = np.full(N, 2.0**-12, np.float16)  # a quarter of binary16's ulp at 1
    mean = fpu.add(a, b).astype(np.float64).mean()
    assert abs(mean - (1 + 2.0**-12)) <= 5 * math.sqrt(0.25 * 0.75 / N) * 2.0**-10


def test_reproducible_and_counter_based() -> None:
    x = np.random.default_rng(0).standard_normal(10_000).astype(np.float32)
    one = Fpu(rounding="stochastic", format=BINARY32, seed=5)
    two = Fpu(rounding="stochastic", format=BINARY32, seed=5)
    first = one.convert(x, "float8_e4m3fn").view(np.uint8)
    assert np.array_equal(first, two.convert(x, "float8_e4m3fn").view(np.uint8))  # same seed, same bits
    # element i's bits depend on i, not on how much follows it
    prefix = Fpu(rounding="stochastic", format=BINARY32, seed=5).convert(x[:1234], "float8_e4m3fn").view(np.uint8)
    assert np.array_equal(prefix, first[:1234])
    # each operation draws afresh, and another seed draws differently
    assert not np.array_equal(first, one.convert(x, "float8_e4m3fn").view(np.uint8))
    other = Fpu(rounding="stochastic", format=BINARY32, seed=6).convert(x, "float8_e4m3fn").view(np.uint8)
    assert not np.array_equal(first, other)


def test_exact_values_stay_exact() -> None:
    x = formats.decode(np.arange(256, dtype=np.uint8), "float8_e4m3fn")
    x = x[np.isfinite(x)].astype(np.float32)
    codes, flags = Fpu(rounding="stochastic", format=BINARY32).convert(x, "float8_e4m3fn", return_flags=True)
    assert np.array_equal(codes.astype(np.float32), x) and not flags.any()


def test_bad_settings_are_named() -> None:
    with pytest.raises(ValueError, match="random_bits"):
        Fpu(rounding="stochastic", random_bits=0)
    with pytest.raises(ValueError, match="seed"):
        Fpu(seed=-1)
    with pytest.raises(ValueError, match="casts"):
        Device("atlas-350", rounding="stochastic")


def test_device_casts_stochastically_from_its_seed() -> None:
    x = np.full(1000, 1.01, np.float16)
    a = Device("atlas-350", seed=1).cast(x, "hifloat8", rounding="stochastic")
    b = Device("atlas-350", seed=1).cast(x, "hifloat8", rounding="stochastic")
    c = Device("atlas-350", seed=2).cast(x, "hifloat8", rounding="stochastic")
    assert np.array_equal(a, b) and not np.array_equal(a, c) and np.unique(a).size == 2
