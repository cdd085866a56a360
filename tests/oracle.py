"""An independent reference for the emulator: MPFR (through gmpy2), one element at a time.

MPFR rounds correctly in four directed/nearest modes; ties-away and round-to-odd
are derived from the two neighbours (toward zero and away from zero) with the
exact value to break ties. Flags follow their IEEE definitions, computed here
from the exact value and from a rounding with an unbounded exponent range,
not taken from MPFR (whose underflow is about its own exponent range).
Results are IEEE (INF/NaN mode); saturation expectations are derived by the
tests. A NaN result is returned as the format's canonical quiet NaN.

The formats' limits are the oracle's own (:data:`LIMITS`), typed in from the published
tables, not read from ``sim.formats``: ``Format`` values only name the format and give the
numpy/ml_dtypes dtype through which bit patterns are decoded and encoded.
"""

from __future__ import annotations

from functools import cache
from typing import NamedTuple

import gmpy2
import numpy as np
from gmpy2 import mpfr

from sim import Flag, Format, Rounding, Tininess
from sim.ops import OPS


class Limits(NamedTuple):
    """A format's limits as its publication states them: ``precision`` significand bits, normal
    exponents ``emin``..``emax``, largest finite value ``max``, smallest quantum 2**``qmin`` (the
    smallest subnormal), and for the formats with an IEEE bit layout the sign, infinity and quiet
    bits and the canonical quiet NaN."""

    precision: int
    emin: int
    emax: int
    max: float
    qmin: int
    has_zero: bool = True
    tapered: bool = False
    sign_bit: int = 0
    inf_bits: int = 0
    quiet_bit: int = 0
    default_nan: int = 0

    @property
    def tiny(self) -> float:
        return 2.0**self.emin


#: IEEE 754-2019 table 3.5 (binary16, binary32, binary64); bfloat16: binary32's exponent with an
#: 8-bit significand (Intel's BF16 specification, 2018); OCP OFP8 v1.0 table 1 (E4M3: bias 7, max
#: S.1111.110 = 448, no Inf; E5M2: bias 15, max 57344); OCP MX v1.0 section 5.3 (FP6 E2M3 max 7.5,
#: E3M2 max 28, FP4 E2M1 max 6; E8M0: 2**-127 .. 2**127, no zero); E1M2 and HiFloat4's element (CANN
#: opbase float4_e1m2.h, hifloat4.h): bias 1, max 1.75, smallest normal 1, subnormals 0.25 to 0.75;
#: HiFloat8 (arXiv 2409.16626, table 2): normal binades 2**-15 .. 2**15 (the code of 1.5 * 2**15 is
#: Inf), denormals down to 2**-22.
LIMITS = {
    "binary16": Limits(11, -14, 15, 65504.0, -24, sign_bit=0x8000, inf_bits=0x7C00, quiet_bit=0x200,
                       default_nan=0x7E00),
    "bfloat16": Limits(8, -126, 127, (2 - 2.0**-7) * 2.0**127, -133, sign_bit=0x8000, inf_bits=0x7F80,
                       quiet_bit=0x40, default_nan=0x7FC0),
    "binary32": Limits(24, -126, 127, (2 - 2.0**-23) * 2.0**127, -149, sign_bit=0x8000_0000,
                       inf_bits=0x7F80_0000, quiet_bit=0x40_0000, default_nan=0x7FC0_0000),
    "binary64": Limits(53, -1022, 1023, (2 - 2.0**-52) * 2.0**1023, -1074, sign_bit=1 << 63,
                       inf_bits=0x7FF0 << 48, quiet_bit=1 << 51, default_nan=0x7FF8 << 48),
    "float8_e4m3fn": Limits(4, -6, 8, 448.0, -9),
    "float8_e5m2": Limits(3, -14, 15, 57344.0, -16),
    "float6_e2m3fn": Limits(4, 0, 2, 7.5, -3),
    "float6_e3m2fn": Limits(3, -2, 4, 28.0, -4),
    "float4_e2m1fn": Limits(2, 0, 2, 6.0, -1),
    "float4_e1m2fn": Limits(3, 0, 0, 1.75, -2),
    "hifloat4": Limits(3, 0, 0, 1.75, -2),
    "float8_e8m0fnu": Limits(1, -127, 127, 2.0**127, -127, has_zero=False),
    "hifloat8": Limits(4, -15, 15, 2.0**15, -22, tapered=True),
}


def limits(fmt: Format) -> Limits:
    return LIMITS[fmt.name]


MPFR_MODE = {
    Rounding.NEAREST_EVEN: gmpy2.RoundToNearest,
    Rounding.TOWARD_ZERO: gmpy2.RoundToZero,
    Rounding.UPWARD: gmpy2.RoundUp,
    Rounding.DOWNWARD: gmpy2.RoundDown,
}
EXACT = gmpy2.context(precision=600, emin=-(1 << 20), emax=1 << 20)


@cache
def context(fmt: Format, mode, bounded: bool) -> gmpy2.context:
    """binary-p arithmetic in MPFR: precision p, exponents as the format (or unbounded)."""
    lim = limits(fmt)
    if bounded:
        return gmpy2.context(precision=lim.precision, emin=lim.qmin + 1, emax=lim.emax + 1, subnormalize=True,
                             round=mode)
    return gmpy2.context(precision=lim.precision, emin=-(1 << 20), emax=1 << 20, round=mode)


def decode(bits: int, fmt: Format) -> mpfr:
    with np.errstate(invalid="ignore"):
        value = float(np.array([bits], fmt.uint).view(fmt.dtype)[0].astype(np.float64))
    return mpfr(value, 64)


def encode(v: mpfr, fmt: Format) -> int:
    if gmpy2.is_nan(v):
        return limits(fmt).default_nan
    return int(np.array([float(v)]).astype(fmt.dtype).view(fmt.uint)[0])


def is_snan(bits: int, fmt: Format) -> bool:
    mag = bits & (limits(fmt).sign_bit - 1)
    return mag > limits(fmt).inf_bits and not mag & limits(fmt).quiet_bit


def _sigmoid(ctx, x: mpfr) -> mpfr:
    """1 / (1 + e**-x) rounded once in ``ctx``. Far from 0 the small term is computed at 600
    bits and the one rounding is MPFR's (1 - t, or e**x / (1 + e**x)); beyond EXACT's
    range the small term is any positive number that small, which rounds the same."""
    if gmpy2.is_infinite(x):
        return mpfr(1 if x > 0 else 0)
    tiny = mpfr(2) ** (EXACT.emin + 1)
    if x >= 0:
        y = EXACT.exp(-x) or tiny
        return ctx.sub(1, EXACT.div(y, EXACT.add(1, y)))
    y = EXACT.exp(x)
    if gmpy2.is_zero(y):
        return ctx.exp(x)  # e**x / (1 + e**x) and e**x are the same to 10**6 bits: one rounding
    return ctx.plus(EXACT.div(y, EXACT.add(1, y)))


#: Functions whose value is exact only at these arguments (transcendental elsewhere).
EXACT_AT = {op.name: op.exact_at for op in OPS if op.exact_at}
#: Operations whose MPFR name differs.
MPFR_NAMES = {op.name: op.mpfr for op in OPS if op.mpfr}


def _apply(ctx, op: str, xs: list[mpfr]) -> mpfr:
    ctx.clear_flags()
    if op == "convert":
        return ctx.plus(xs[0])
    if op == "rint":
        return ctx.rint(xs[0])
    if op == "sigmoid":
        return _sigmoid(ctx, xs[0])
    return getattr(ctx, MPFR_NAMES.get(op, op))(*xs)


def _lsb(v: mpfr, p: int) -> int:
    """Last bit of v's p-bit significand (binary64-style, unbounded exponent)."""
    if gmpy2.is_zero(v) or not gmpy2.is_finite(v):
        return 0
    m, _ = v.as_mantissa_exp()
    m = abs(int(m))
    shift = m.bit_length() - p
    return (m >> shift) & 1 if shift >= 0 else 0


def _round(fmt: Format, op: str, xs: list[mpfr], mode: Rounding, bounded: bool, exact: mpfr, is_exact: bool):
    """Correctly rounded op in any of the six modes."""
    if mode in MPFR_MODE:
        return _apply(context(fmt, MPFR_MODE[mode], bounded), op, xs)
    down = _apply(context(fmt, gmpy2.RoundToZero, bounded), op, xs)
    up = _apply(context(fmt, gmpy2.RoundAwayZero, bounded), op, xs)
    if down == up or not gmpy2.is_finite(exact):
        return down
    if mode is Rounding.ODD:
        if bounded:
            return down if encode(down, fmt) & 1 else up
        return down if _lsb(down, limits(fmt).precision) else up
    # NEAREST_AWAY: nearer neighbour, ties away from zero.
    mid = EXACT.div(EXACT.add(down, up), 2)
    if is_exact and exact == mid:
        return up
    return down if abs(EXACT.sub(exact, down)) < abs(EXACT.sub(up, exact)) else up


def reference(op: str, operands: list[int], fmt: Format, mode: Rounding,
              tininess: Tininess = Tininess.AFTER, src: Format | None = None) -> tuple[int, int]:
    """(result bits, flags) of ``op`` on bit patterns, IEEE semantics.

    op: add sub mul div sqrt fma exp log tanh erf (MPFR names), "rsqrt", "sigmoid", "reciprocal", "convert"
    (from ``src``) or "rint" (round to integral, no INEXACT).
    """
    src = src or fmt
    xs = [decode(b, src) for b in operands]
    flags = 0
    if any(is_snan(b, src) for b in operands):
        flags |= Flag.INVALID
    if any(gmpy2.is_nan(x) for x in xs):
        return limits(fmt).default_nan, flags
    if op == "rint":
        exact = xs[0]
        fn = {Rounding.NEAREST_EVEN: gmpy2.rint, Rounding.TOWARD_ZERO: gmpy2.rint_trunc,
              Rounding.UPWARD: gmpy2.rint_ceil, Rounding.DOWNWARD: gmpy2.rint_floor,
              Rounding.NEAREST_AWAY: gmpy2.rint_round, Rounding.ODD: gmpy2.rint_trunc}[mode]
        r = fn(exact)  # binary16 values and their integral neighbours are exact at 53 bits
        if mode is Rounding.ODD and r != exact and int(r) % 2 == 0:
            r = EXACT.add(r, gmpy2.copy_sign(mpfr(1), exact))
        return encode(gmpy2.copy_sign(r, exact), fmt), flags
    if op == "reciprocal":
        op, xs = "div", [mpfr(1), *xs]
    if op == "rsqrt" and gmpy2.is_zero(xs[0]):  # IEEE 754 rSqrt(+-0) = +-Inf (MPFR gives +Inf for both)
        return encode(gmpy2.copy_sign(mpfr("inf"), xs[0]), fmt), flags | Flag.DIVBYZERO
    if op == "fma" and any(gmpy2.is_infinite(x) for x in xs[:2]) and any(gmpy2.is_zero(x) for x in xs[:2]):
        return limits(fmt).default_nan, flags | Flag.INVALID
    exact = _apply(EXACT, op, xs)
    is_exact = not EXACT.inexact
    if op in EXACT_AT:  # transcendental: exact at its trivial points and at infinities only
        is_exact = xs[0] in EXACT_AT[op] or gmpy2.is_infinite(xs[0])
    if gmpy2.is_nan(exact):
        return limits(fmt).default_nan, flags | Flag.INVALID
    if gmpy2.is_infinite(exact) and (is_exact or op != "exp"):  # exp of a huge finite x overflows
        if (op == "div" and gmpy2.is_zero(xs[1]) and gmpy2.is_finite(xs[0])) or (op == "log" and xs[0] == 0):
            flags |= Flag.DIVBYZERO
        return encode(exact, fmt), flags
    result = _round(fmt, op, xs, mode, True, exact, is_exact)
    unbounded = _round(fmt, op, xs, mode, False, exact, is_exact)
    inexact = not is_exact or result != exact
    if abs(unbounded) > limits(fmt).max:
        flags |= Flag.OVERFLOW | Flag.INEXACT
        to_inf = mode in (Rounding.NEAREST_EVEN, Rounding.NEAREST_AWAY) or \
            (mode is Rounding.UPWARD and exact > 0) or (mode is Rounding.DOWNWARD and exact < 0)
        result = gmpy2.copy_sign(mpfr("inf") if to_inf else mpfr(limits(fmt).max), exact)
    elif inexact:
        flags |= Flag.INEXACT
        tiny_value = exact if tininess is Tininess.BEFORE else unbounded
        if abs(tiny_value) < limits(fmt).tiny:
            flags |= Flag.UNDERFLOW
    return encode(result, fmt), flags


def saturated(bits: int, fmt: Format) -> int:
    """The saturation-mode image of an IEEE result."""
    mag = bits & (limits(fmt).sign_bit - 1)
    if mag == limits(fmt).inf_bits:
        return bits - 1
    return 0 if mag > limits(fmt).inf_bits else bits


# -- the 8-bit formats ---------------------------------------------------------------------
def hifloat8_table() -> dict[int, float]:
    """HiFloat8's codes and values, read off the paper's definition (arXiv 2409.16626, table 2)
    field by field from the bit string: written apart from sim.formats' decoder, to check it."""
    dots = {"11": (4, 1), "10": (3, 2), "01": (2, 3), "001": (1, 3), "0001": (0, 3)}
    table = {}
    for code in range(256):
        b = f"{code:08b}"
        sign, rest = -1.0 if b[0] == "1" else 1.0, b[1:]
        if rest.startswith("0000"):
            m = int(rest[4:], 2)
            table[code] = sign * 2.0 ** (m - 23) if m else 0.0
            continue
        dot = next(d for d in dots if rest.startswith(d))
        width, mbits = dots[dot]
        field = rest[len(dot):]
        e_bits, m_bits = field[:width], field[width:]
        assert len(m_bits) == mbits
        e = 0 if width == 0 else (-1 if e_bits[0] == "1" else 1) * int("1" + e_bits[1:], 2)
        table[code] = sign * (1 + int(m_bits, 2) / 2**mbits) * 2.0**e
    table[0x80] = float("nan")
    table[0x6F], table[0xEF] = float("inf"), float("-inf")
    return table


def hifloat8_precision(e: int) -> int:
    """Significand bits of HiFloat8's binade 2**e (the paper's table 2 and denormals)."""
    a = abs(e)
    return 4 if a <= 3 else 3 if a <= 7 else 2 if a <= 15 else 1


def _neighbours(x: mpfr, p: int) -> tuple[mpfr, mpfr]:
    """x rounded toward and away from zero to p bits (unbounded exponent)."""
    lo = gmpy2.context(precision=p, emin=-(1 << 20), emax=1 << 20, round=gmpy2.RoundToZero).plus(x)
    hi = gmpy2.context(precision=p, emin=-(1 << 20), emax=1 << 20, round=gmpy2.RoundAwayZero).plus(x)
    return lo, hi


def _pick(x: mpfr, lo: mpfr, hi: mpfr, mode: Rounding, lsb_lo: int) -> mpfr:
    """The neighbour ``mode`` picks: lo is toward zero, hi away (equal when x is exact)."""
    if lo == hi:
        return lo
    if mode is Rounding.TOWARD_ZERO:
        return lo
    if mode is Rounding.UPWARD:
        return hi if x > 0 else lo
    if mode is Rounding.DOWNWARD:
        return hi if x < 0 else lo
    if mode is Rounding.ODD:
        return lo if lsb_lo else hi
    d_lo, d_hi = abs(EXACT.sub(x, lo)), abs(EXACT.sub(hi, x))
    if d_lo != d_hi:
        return lo if d_lo < d_hi else hi
    return hi if mode is Rounding.NEAREST_AWAY else (lo if not lsb_lo else hi)


def reference8(x: float, fmt: Format, mode: Rounding, tininess: Tininess = Tininess.AFTER) -> tuple[float, int]:
    """A finite non-zero binary64 ``x`` rounded into an 8-bit format by MPFR: (value, flags), the
    value +-inf where the result overflows away from zero (the caller maps it to the format's
    Inf, NaN or MAX). HiFloat8 keeps hifloat8_precision(e) bits in binade e, with quantum 2**-22
    below; E8M0 keeps one bit from 2**-127 to 2**127 and has no zero (anything below gives
    2**-127, as ml_dtypes does); the IEEE-like formats keep their precision down to qmin."""
    v = mpfr(x, 64)
    e = int(gmpy2.floor(gmpy2.log2(abs(v))))
    if limits(fmt).tapered:
        p, q = hifloat8_precision(e), -22
    else:  # E8M0: one bit, down to 2**-127
        p, q = limits(fmt).precision, limits(fmt).qmin
    if e - (p - 1) < q:  # the quantum 2**q is coarser than p bits here
        p = e - q + 1
    if p <= 0:  # below half the smallest quantum: 0 or 2**q
        lo, hi = gmpy2.copy_sign(mpfr(0), v), gmpy2.copy_sign(mpfr(2) ** q, v)
        lsb = 0
    else:
        lo, hi = _neighbours(v, p)
        lsb = _lsb(lo, p)
    r = _pick(v, lo, hi, mode, lsb)
    # Tininess after rounding: to the binade's precision with an unbounded exponent.
    tiny_limit = mpfr(2) ** limits(fmt).emin
    if tininess is Tininess.AFTER:
        pt = hifloat8_precision(e) if limits(fmt).tapered else limits(fmt).precision
        lo_u, hi_u = _neighbours(v, pt)
        tiny = abs(_pick(v, lo_u, hi_u, mode, _lsb(lo_u, pt))) < tiny_limit
    else:
        tiny = abs(v) < tiny_limit
    flags = 0
    if r != v:
        flags |= Flag.INEXACT | (Flag.UNDERFLOW if tiny else 0)
    if not limits(fmt).has_zero and r == 0:
        r = mpfr(2) ** -127
    if abs(r) > limits(fmt).max:
        flags |= Flag.OVERFLOW | Flag.INEXACT
        away = mode in (Rounding.NEAREST_EVEN, Rounding.NEAREST_AWAY) or (mode is Rounding.UPWARD and x > 0) or \
            (mode is Rounding.DOWNWARD and x < 0)
        return (float("inf") if away else limits(fmt).max) * (1 if x > 0 else -1), flags
    return float(r), flags
