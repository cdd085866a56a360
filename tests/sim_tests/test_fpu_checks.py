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
            _, flags = fpu.convert(x, dst.dtype if dst.dtype != np.uint8 else dst.name, overflow=overflow,
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


@pytest.mark.parametrize("fmt", [BINARY16, BFLOAT16, BINARY32], ids=lambda f: f.name)
def test_default_nan_must_be_a_quiet_nan_of_the_format(fmt: Format) -> None:
    q, s = fmt.default_nan, fmt.sign_bit
    for good in (q, q | 1, s - 1, q | s, np.uint32(q)):
        fpu = Fpu(format=fmt, default_nan=good)
        assert int(fpu.sqrt(np.array(-1, fmt.dtype)).view(fmt.uint)) == int(good)
    bad = {1: "subnormal", 1 << fmt.width: "wider", -5: "negative", fmt.inf_bits: "infinity",
           fmt.inf_bits | 1: "signaling", 0: "zero", fmt.inf_bits - 1: "finite"}
    for value, what in bad.items():
        with pytest.raises(ValueError, match=rf"default_nan .*{what}.*quiet NaN of {fmt.name}, {q:#x}\.\."):
            Fpu(format=fmt, default_nan=value)
    for value in (1.5, True, "0x7e00"):
        with pytest.raises(TypeError, match="default_nan must be an integer bit pattern"):
            Fpu(format=fmt, default_nan=value)


def test_default_nan_0x1_no_longer_gives_a_subnormal() -> None:
    with pytest.raises(ValueError, match=r"default_nan 0x1 is a subnormal number, not a quiet NaN"):
        Fpu(default_nan=0x1)
    with pytest.raises(ValueError, match=r"default_nan -5 is negative"):
        Fpu(default_nan=-5)


def test_satfinite_is_saturation_with_nan_kept_for_every_operation() -> None:
    H = np.float16
    fpu = Fpu(overflow="satfinite")
    same = Fpu(overflow="saturation", nan_to_zero=False)
    assert fpu.overflow is OverflowMode.SATURATION and not fpu.nan_to_zero and repr(fpu) == repr(same)
    z, f = fpu.mul(H(300), H(300), return_flags=True)
    assert float(z) == 65504.0 and f == Flag.OVERFLOW | Flag.INEXACT
    assert np.isnan(fpu.sqrt(H(-1))) and float(fpu.add(H(np.inf), H(1))) == 65504.0
    x = np.array([np.nan, np.inf, 1e6, -1e6, 1.0], np.float32)
    for fmt in EIGHT_BIT:  # the unit's setting is the cast's
        assert np.array_equal(Fpu(overflow="satfinite", format=BINARY32).convert(x, fmt.name).view(np.uint8),
                              Fpu(format=BINARY32).convert(x, fmt.name, overflow="satfinite").view(np.uint8))
    assert Fpu(overflow=" SATFINITE ").overflow is OverflowMode.SATURATION
    assert Fpu(overflow="satfinite", nan_to_zero=False).nan_to_zero is False
    with pytest.raises(ValueError, match="satfinite.*keeps NaN.*nan_to_zero=True"):
        Fpu(overflow="satfinite", nan_to_zero=True)
    with pytest.raises(ValueError, match="unknown overflow 'wrap'; valid: SATURATION.*INF_NAN.*satfinite"):
        Fpu(overflow="wrap")
    assert Fpu().nan_to_zero and Fpu("saturation").nan_to_zero  # the default is unchanged
