"""Casts into the narrow formats: E4M3FN, E5M2, E3M2, E2M3, E2M1 and E8M0 against ml_dtypes (every
binary16 input, NaNs included, 10**6 binary32 values) and against MPFR in every mode with flags; E1M2 and
HiFloat4's element (no ml_dtypes type) against MPFR on every binary16 and bfloat16 input; HiFloat8 against its
definition in TA, HR and every other mode; the three overflow behaviours; the device's register."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import (
    BINARY16,
    BINARY32,
    FLOAT4_E1M2FN,
    FLOAT4_E2M1FN,
    FLOAT6_E2M3FN,
    FLOAT6_E3M2FN,
    FLOAT8_E4M3FN,
    FLOAT8_E5M2,
    FLOAT8_E8M0FNU,
    HIFLOAT4,
    HIFLOAT8,
    SIX_MODES,
    Device,
    Flag,
    Fpu,
    LegacyModeWarning,
    OverflowMode,
    Rounding,
    formats,
)

from groups import representatives
from oracle import hifloat8_table, reference8

# The formats without NaN (E3M2, E2M3, E2M1) take a NaN of sign s to the zero of the other sign and
# saturate Inf and overflow to +-MAX, as ml_dtypes casts.
OCP = (FLOAT8_E4M3FN, FLOAT8_E5M2, FLOAT6_E3M2FN, FLOAT6_E2M3FN, FLOAT4_E2M1FN)
ALL16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
HIF8 = hifloat8_table()
HIF8_CODE = {v: c for c, v in HIF8.items() if not math.isnan(v)} | {0.0: 0}
#: The 4-bit formats ml_dtypes lacks (uint8 codes): like E2M1, no Inf or NaN.
FOUR = (FLOAT4_E1M2FN, HIFLOAT4)
MPFR_FORMATS = (*OCP, *FOUR, FLOAT8_E8M0FNU, HIFLOAT8)


def _four_bit_code(fmt, r: float) -> int:
    """The code of a value of a 4-bit format from the header's layout (bit 3 the sign, bit 2 the
    exponent of bias 1, bits 1-0 the fraction), an overflow saturating to +-1.75 (no Inf)."""
    magnitude = min(abs(r), 1.75)
    e = int(magnitude >= 1)
    m = int((magnitude - e) * 4)  # normal: 1 + m/4; subnormal: m/4
    assert (e + m / 4 if e else m / 4) == magnitude, (fmt.name, r)
    return int(math.copysign(1, r) < 0) << 3 | e << 2 | m


def ml(x: np.ndarray, fmt) -> np.ndarray:
    with np.errstate(all="ignore"):
        return x.astype(fmt.dtype).view(np.uint8)


def clamp(codes: np.ndarray, fmt, x: np.ndarray, keep_nan: bool) -> np.ndarray:
    """Saturation as the clamp of ml_dtypes' non-saturating cast: a NaN or Inf from a non-NaN
    input becomes +-MAX; a NaN input becomes +0 (or stays)."""
    with np.errstate(invalid="ignore"):
        v = codes.view(fmt.dtype).astype(np.float64)
        nan_in = np.isnan(x.astype(np.float64))
    top = np.array([fmt.max], np.float64).astype(fmt.dtype).view(np.uint8)[0]
    out = codes.copy()
    beyond = ~nan_in & ~np.isfinite(v)
    out[beyond] = np.where(x[beyond] < 0, top | 0x80, top)
    if not keep_nan:
        out[nan_in] = 0
    return out


@pytest.mark.parametrize("fmt", OCP, ids=lambda f: f.name)
def test_nearest_even_agrees_with_ml_dtypes_on_every_binary16(fmt) -> None:
    want = ml(ALL16, fmt)
    assert np.array_equal(Fpu().convert(ALL16, fmt.dtype).view(np.uint8), want)
    sat = Fpu(OverflowMode.SATURATION)
    assert np.array_equal(sat.convert(ALL16, fmt.name).view(np.uint8), clamp(want, fmt, ALL16, False))
    assert np.array_equal(Fpu().convert(ALL16, fmt.name, overflow="satfinite").view(np.uint8),
                          clamp(want, fmt, ALL16, True))


@pytest.mark.parametrize("fmt", OCP, ids=lambda f: f.name)
def test_nearest_even_agrees_with_ml_dtypes_on_random_binary32(fmt) -> None:
    x = np.random.default_rng(14).integers(0, 2**32, 10**6, dtype=np.uint64).astype(np.uint32).view(np.float32)
    want = ml(x, fmt)
    assert np.array_equal(Fpu(format=BINARY32).convert(x, fmt.name).view(np.uint8), want)
    assert np.array_equal(Fpu(OverflowMode.SATURATION).convert(x, fmt.name).view(np.uint8),
                          clamp(want, fmt, x, False))


def test_e8m0_agrees_with_ml_dtypes_on_every_binary16() -> None:
    want = ml(ALL16, FLOAT8_E8M0FNU)
    codes, flags = Fpu().convert(ALL16, "float8_e8m0fnu", return_flags=True)
    assert np.array_equal(codes.view(np.uint8), want)
    x = ALL16.astype(np.float64)
    assert np.all(flags[x <= 0] == Flag.INVALID)  # no sign and no zero: NaN, invalid


def _expected(x: np.ndarray, fmt, mode: Rounding) -> tuple[np.ndarray, np.ndarray]:
    """Codes and flags from the MPFR oracle for finite non-zero x (NaN-free)."""
    codes, flags = np.empty(x.size, np.uint8), np.empty(x.size, np.uint8)
    for i, v in enumerate(x.astype(np.float64)):
        if fmt is FLOAT8_E8M0FNU and v < 0:  # no sign: NaN, invalid
            codes[i], flags[i] = 0xFF, Flag.INVALID
            continue
        r, f = reference8(float(v), fmt, mode)
        flags[i] = f
        if fmt is HIFLOAT8:
            codes[i] = HIF8_CODE[r]
        elif fmt in FOUR:
            codes[i] = _four_bit_code(fmt, r)
        else:
            codes[i] = np.array([r]).astype(fmt.dtype).view(np.uint8)[0]
    return codes, flags


def _finite16(step: int) -> np.ndarray:
    x = ALL16[::step]
    return x[np.isfinite(x) & (x != 0)]


@pytest.mark.parametrize("mode", representatives(SIX_MODES, (Rounding.NEAREST_EVEN, Rounding.DOWNWARD).__contains__,
                                                  lambda m: m.name))  # the other four: -m slow
@pytest.mark.parametrize("fmt", MPFR_FORMATS, ids=lambda f: f.name)
def test_every_mode_against_mpfr(fmt, mode: Rounding) -> None:
    x = _finite16(11)  # every 11th binary16 (a stride coprime to every binade); all of them: -m exhaustive
    codes, flags = Fpu(rounding=mode).convert(x, fmt.name, return_flags=True)
    want, want_flags = _expected(x, fmt, mode)
    got = codes.view(np.uint8)
    bad = np.flatnonzero((got != want) | (flags != want_flags))
    assert bad.size == 0, (f"{fmt.name} {mode.name}: {bad.size} mismatches; first {float(x[bad[0]])!r}: got "
                           f"{got[bad[0]]:#x}/{flags[bad[0]]} want {want[bad[0]]:#x}/{want_flags[bad[0]]}")


@pytest.mark.exhaustive
@pytest.mark.parametrize("fmt", MPFR_FORMATS, ids=lambda f: f.name)
def test_every_binary16_in_every_mode_against_mpfr(fmt) -> None:
    x = _finite16(1)
    for mode in SIX_MODES:
        codes, flags = Fpu(rounding=mode).convert(x, fmt.name, return_flags=True)
        want, want_flags = _expected(x, fmt, mode)
        got = codes.view(np.uint8)
        bad = np.flatnonzero((got != want) | (flags != want_flags))
        assert bad.size == 0, f"{fmt.name} {mode.name}: {bad.size} mismatches; first {float(x[bad[0]])!r}"


@settings(max_examples=300, deadline=None)
@given(bits=st.integers(0, 2**32 - 1), mode=st.sampled_from(SIX_MODES),
       fmt=st.sampled_from(MPFR_FORMATS))
def test_binary32_against_mpfr(bits: int, mode: Rounding, fmt) -> None:
    x = np.array([bits], np.uint32).view(np.float32)
    if not np.isfinite(x[0]) or x[0] == 0:
        return
    code, flags = Fpu(rounding=mode).convert(x, fmt.name, return_flags=True)
    want, want_flags = _expected(x, fmt, mode)
    assert (code.view(np.uint8)[0], flags[0]) == (want[0], want_flags[0])


@pytest.mark.parametrize("mode", SIX_MODES, ids=lambda m: m.name)
def test_e8m0_at_both_ends_of_its_range_against_mpfr(mode: Rounding) -> None:
    """E8M0's binades 2**-127 .. 2**127 lie beyond binary16's, so the casts of every binary16 never
    reach its ends: binary32 values there, against the MPFR oracle, and the powers of two by hand
    (OCP MX v1.0 section 5.4: 2**e is code e + 127)."""
    e = np.arange(-127, 128)
    powers = np.ldexp(1.0, e).astype(np.float32)
    codes = Fpu(rounding=mode).convert(powers, "float8_e8m0fnu").view(np.uint8)
    assert codes.tolist() == (e + 127).tolist()
    edges = np.array([m * 2.0**k for k in (-127, -126, 126, 127) for m in (1.0, 1.25, 1.5, 1.75, 1.9999999)],
                     np.float32)
    got, flags = Fpu(rounding=mode).convert(edges, "float8_e8m0fnu", return_flags=True)
    want, want_flags = _expected(edges, FLOAT8_E8M0FNU, mode)
    assert got.view(np.uint8).tolist() == want.tolist() and flags.tolist() == want_flags.tolist()


def test_hifloat8_decode_matches_the_definition() -> None:
    values = formats.decode(np.arange(256, dtype=np.uint8), "hifloat8")
    assert values.dtype == np.float64
    want = np.array([HIF8[c] for c in range(256)])
    assert np.array_equal(values, want, equal_nan=True)
    positive = values[np.isfinite(values) & (values > 0)]
    assert positive.size == 126 and positive.min() == 2.0**-22 and positive.max() == 32768
    assert np.unique(np.floor(np.log2(positive))).size == 38  # 38 binades
    assert math.isnan(values[0x80]) and values[0x6F] == np.inf and values[0xEF] == -np.inf
    assert np.count_nonzero(values == 0) == 1  # one zero


@pytest.mark.parametrize("rounding", [Rounding.NEAREST_AWAY, Rounding.HYBRID, *SIX_MODES])
def test_hifloat8_encode_inverts_decode(rounding: Rounding) -> None:
    codes = np.arange(256, dtype=np.uint8)
    values = formats.decode(codes, "hifloat8")
    finite = np.isfinite(values)
    got, flags = Fpu(format=BINARY32).convert(values[finite].astype(np.float32), "hifloat8", rounding=rounding,
                                              return_flags=True)
    assert np.array_equal(got, codes[finite]) and not flags.any()


def test_hifloat8_ties_away_edges() -> None:
    fpu = Fpu(format=BINARY32, rounding="rna")
    below = np.nextafter(np.float32(2.0**-23), np.float32(0))
    x = np.array([40959.996, 40960, 2.0**-23, below, 1.0625, np.nan, -np.inf, -0.0], np.float32)
    assert [int(c) for c in fpu.convert(x, "hifloat8")] == [0x6E, 0x6F, 0x01, 0x00, 0x09, 0x80, 0xEF, 0x00]
    sat = Fpu(OverflowMode.SATURATION, format=BINARY32, rounding="rna")
    assert [int(c) for c in sat.convert(x[[1, 5, 6]], "hifloat8")] == [0x6E, 0x00, 0xEE]
    assert [int(c) for c in sat.convert(x[[1, 5, 6]], "hifloat8", overflow="satfinite")] == [0x6E, 0x80, 0xEE]


def _hybrid(x: float, src) -> float:
    """HR on one value, from its bits: ties away where |E| < 4; elsewhere the simplified stochastic
    rounding of arXiv 2409.16626 section 3.2 (round up when the top dropped bits F reach the
    threshold T, F non-zero: binary32 F and T 14 bits, T its 14 low fraction bits; 16-bit T =
    {LSB, 1}); below 2**-23, 0."""
    e = math.floor(math.log2(abs(x)))
    if abs(e) < 4:
        return reference8(x, HIFLOAT8, Rounding.NEAREST_AWAY)[0]
    if e < -23:
        return 0.0
    man = src.man_bits
    raw = int(np.array([x], src.dtype).view(src.uint)[0]) & ((1 << man) - 1)
    lsb_exp = max(e - man, src.qmin)
    sig = int(abs(x) / 2.0**lsb_exp)  # exact: the value is sig * 2**lsb_exp
    q = max(e - (hifloat8_precision_of(e) - 1), -22)
    drop = q - lsb_exp
    k = 14 if src is BINARY32 else 2
    t = raw & ((1 << k) - 1) if k == 14 else 2 * (raw & 1) + 1
    f = (sig >> (drop - k)) & ((1 << k) - 1)
    kept = (sig >> drop) + (1 if f >= t and f != 0 else 0)
    r = math.copysign(kept * 2.0**q, x)
    return r if abs(r) <= 32768 else math.copysign(math.inf, x)


def hifloat8_precision_of(e: int) -> int:
    a = abs(e)
    return 4 if a <= 3 else 3 if a <= 7 else 2 if a <= 15 else 1


@pytest.mark.parametrize("src", [BINARY16, BINARY32], ids=lambda f: f.name)
def test_hifloat8_hybrid_rounding(src) -> None:
    rng = np.random.default_rng(8)
    if src is BINARY16:
        x = _finite16(1)
    else:
        x = (rng.standard_normal(20000) * 2.0 ** rng.integers(-22, 16, 20000)).astype(np.float32)
    x = x[x != 0]
    got = Fpu(format=src).convert(x, "hifloat8", rounding="hybrid")
    want = np.array([HIF8_CODE[_hybrid(float(v), src)] for v in x.astype(np.float64)], np.uint8)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} mismatches; first {float(x[bad[0]])!r}: {got[bad[0]]:#x} != {want[bad[0]]:#x}"


def test_hybrid_rounding_is_hifloat8_only() -> None:
    with pytest.raises(ValueError, match="hybrid rounding"):
        Fpu().convert(np.float16(1), "float8_e4m3fn", rounding="hybrid")


def test_overflow_behaviours_hand_worked() -> None:
    x = np.array([500, -1e5, np.inf, np.nan], np.float32)
    ieee = Fpu(format=BINARY32)
    assert [int(c) for c in ieee.convert(x, "float8_e4m3fn").view(np.uint8)] == [0x7F, 0xFF, 0x7F, 0x7F]
    assert [int(c) for c in ieee.convert(x, "float8_e5m2").view(np.uint8)] == [0x60, 0xFC, 0x7C, 0x7E]
    sat = Fpu(OverflowMode.SATURATION, format=BINARY32)
    assert [int(c) for c in sat.convert(x, "float8_e4m3fn").view(np.uint8)] == [0x7E, 0xFE, 0x7E, 0x00]
    kept = Fpu(OverflowMode.SATURATION, format=BINARY32, nan_to_zero=False)
    assert [int(c) for c in kept.convert(x, "float8_e4m3fn").view(np.uint8)] == [0x7E, 0xFE, 0x7E, 0x7F]
    _, flags = ieee.convert(x, "float8_e4m3fn", return_flags=True)
    assert list(flags) == [Flag.OVERFLOW | Flag.INEXACT, Flag.OVERFLOW | Flag.INEXACT, Flag.INVALID, 0]


@pytest.mark.parametrize("fmt", (FLOAT6_E3M2FN, FLOAT6_E2M3FN, FLOAT4_E2M1FN, FLOAT8_E4M3FN), ids=lambda f: f.name)
def test_a_nan_or_infinity_the_format_cannot_hold_is_invalid(fmt) -> None:
    """IEEE 754-2019 5.8: a conversion whose destination cannot represent a NaN or infinite operand
    signals INVALID. FP6 and FP4 hold neither, E4M3FN no infinity; in saturation mode the mode
    maps them (Inf -> MAX, NaN -> 0), no INVALID; satfinite keeps NaN, so FP6/FP4 cannot."""
    x = ALL16.astype(np.float64)
    nan, inf = np.isnan(x), np.isinf(x)
    snan = nan & ((ALL16.view(np.uint16) & 0x200) == 0)  # a signaling NaN is invalid anyway
    holds_nan = fmt is FLOAT8_E4M3FN
    for fpu, want in ((Fpu(), inf | (nan & ~holds_nan)),
                      (Fpu(OverflowMode.SATURATION), np.zeros_like(nan)),
                      (Fpu(overflow="satfinite"), nan & ~holds_nan)):
        _, flags = fpu.convert(ALL16, fmt.name, return_flags=True)
        got = (flags & Flag.INVALID) != 0
        assert np.array_equal(got & ~snan, want & ~snan), (fpu, x[(got != want) & ~snan][:4])
        assert got[snan].all()


def test_device_cast_raises_the_register() -> None:
    dev = Device("atlas-350")
    x = np.array([1.0, 1000.0], np.float16)
    out = dev.cast(x, ml_dtypes.float8_e4m3fn)
    assert out.dtype == ml_dtypes.float8_e4m3fn
    assert dev.status & Flag.OVERFLOW
    assert dev.get_float_status().any()
    # the NPULossScaleOptimizer page's note on atlas-350
    with pytest.warns(LegacyModeWarning, match="compatibility only"):
        sat = Device("atlas-350", "saturation")
    assert float(sat.cast(x, "float8_e4m3fn")[1]) == 448.0
    assert sat.cast(x, "hifloat8").dtype == np.uint8


def test_eight_bit_sources_are_refused_not_misread() -> None:
    x = np.array([1.0, 2.0], np.float32).astype(ml_dtypes.float8_e4m3fn)
    for dst in (np.float16, np.float32, "float8_e5m2"):
        with pytest.raises(TypeError, match="astype"):
            Fpu().convert(x, dst)


def test_e8m0_has_no_zero_for_a_saturated_nan() -> None:
    codes = Fpu(OverflowMode.SATURATION).convert(np.array([np.nan, 0.0], np.float16), "float8_e8m0fnu")
    assert codes.view(np.uint8).tolist() == [0xFF, 0xFF]


def test_bad_format_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        Fpu().convert(np.float16(1), "float8_e4m3")
    with pytest.raises(ValueError, match="satfinite"):
        Fpu().convert(np.float16(1), "hifloat8", overflow="clamp")


@pytest.mark.exhaustive
@pytest.mark.parametrize("fmt", FOUR, ids=lambda f: f.name)
def test_every_bfloat16_in_every_mode_against_mpfr(fmt) -> None:
    """E1M2 and HiFloat4 have no ml_dtypes type to compare with: every finite non-zero bfloat16 in
    each of the six modes against MPFR, values and flags."""
    b = np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16)
    x = b[np.isfinite(b.astype(np.float32)) & (b.astype(np.float32) != 0)]
    for mode in SIX_MODES:
        codes, flags = Fpu(rounding=mode).convert(x, fmt.name, return_flags=True)
        want, want_flags = _expected(x, fmt, mode)
        bad = np.flatnonzero((codes != want) | (flags != want_flags))
        assert bad.size == 0, f"{fmt.name} {mode.name}: {bad.size} mismatches; first {float(x[bad[0]])!r}"


@pytest.mark.parametrize("fmt", FOUR, ids=lambda f: f.name)
def test_four_bit_specials_in_both_overflow_modes(fmt) -> None:
    """Worked by hand from the E2M1 rule the format shares (no Inf, no NaN): an infinity saturates to
    +-1.75 and a NaN becomes the zero of the other sign, both INVALID (IEEE 754-2019 5.8: the
    destination cannot hold them); saturation makes them +-1.75 and +0 without a flag."""
    x = np.array([np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 1.75, -0.25], np.float32)
    codes, flags = Fpu().convert(x, fmt.name, return_flags=True)
    assert codes.dtype == np.uint8
    assert codes.tolist() == [0x7, 0xF, 0x8, 0x0, 0x0, 0x8, 0x7, 0x9]
    assert flags.tolist() == [Flag.INVALID] * 4 + [0] * 4
    codes, flags = Fpu(OverflowMode.SATURATION).convert(x, fmt.name, return_flags=True)
    assert codes.tolist() == [0x7, 0xF, 0x0, 0x0, 0x0, 0x8, 0x7, 0x9] and not flags.any()
