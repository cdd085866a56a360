"""Fpu: the status after casts into the small formats, and the checks of its settings."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from sim import Flag, Fpu, OverflowMode
from sim.formats import BFLOAT16, BINARY16, BINARY32, EIGHT_BIT, Format


def _specials(src: Format) -> np.ndarray:
    big = float(ml_dtypes.finfo(src.dtype).max)
    tiny = float(ml_dtypes.finfo(src.dtype).smallest_subnormal)
    values = [np.nan, -np.nan, np.inf, -np.inf, big, -big, -3e38, 3e38, 1e5, -1e5, 57344.0, 61440.0, 448.0, 464.0,
              480.0, 7.5, 7.75, 28.0, 30.0, 6.0, 6.5, 1.0, 0.75, -0.3, 2.0**-130, tiny, -tiny, 0.0, -0.0, 2.0**127,
              2.0**128, -1.0]
    with np.errstate(over="ignore"):
        x = np.array(values, np.float64).astype(src.dtype)
    bits = x.view(src.uint).copy()
    bits[0] &= ~src.uint.type(src.quiet_bit)  # a signaling NaN: quiet bit off, a payload bit on
    bits[0] |= src.uint.type(1)
    return bits.view(src.dtype)


@pytest.mark.parametrize("dst", EIGHT_BIT, ids=lambda f: f.name)
@pytest.mark.parametrize("src", [BINARY16, BFLOAT16, BINARY32], ids=lambda f: f.name)
def test_cast_status_is_the_or_of_the_element_flags(src: Format, dst: Format) -> None:
    x = _specials(src)
    for unit_mode in OverflowMode:
        for overflow in (None, "inf_nan", "saturation", "satfinite"):
            fpu = Fpu(unit_mode, format=src)
            _, flags = fpu.convert(x, dst.dtype if dst.name != "hifloat8" else "hifloat8", overflow=overflow,
                                   return_flags=True)
            assert fpu.status == Flag(int(np.bitwise_or.reduce(flags))), (unit_mode, overflow)
            for i in range(x.size):  # element by element too: no flag an element did not raise
                one = Fpu(unit_mode, format=src)
                _, f = one.convert(x[i:i + 1], dst.name, overflow=overflow, return_flags=True)
                assert one.status == Flag(int(f[0])) and f[0] == flags[i], (x[i], unit_mode, overflow)


def test_e8m0_negative_raises_only_invalid() -> None:
    fpu = Fpu(format=BINARY32)
    _, flags = fpu.convert(np.array([-3e38], np.float32), "float8_e8m0fnu", return_flags=True)
    assert int(flags[0]) == int(Flag.INVALID) and fpu.status == Flag.INVALID


def test_status_stays_sticky_across_casts() -> None:
    fpu = Fpu(format=BINARY32)
    fpu.mul(np.float32(3e38), np.float32(10))  # OVERFLOW | INEXACT
    fpu.convert(np.array([-3e38], np.float32), "float8_e8m0fnu")
    assert fpu.status == Flag.OVERFLOW | Flag.INEXACT | Flag.INVALID
