"""The exact value of a hard case, to as many bits as its rounding needs (MPFR through gmpy2 where
installed, else exact rationals and decimals), rounded to odd at 53 bits."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING

from .compiled import (
    _BIG,
    ACOS,
    ACOSH,
    ADDCDIV,
    ADDCMUL,
    ASIN,
    ASINH,
    ATAN,
    ATAN2,
    ATANH,
    COS,
    COSH,
    ELU,
    ELU_BW,
    ERF,
    ERFC,
    ERFINV,
    EXP,
    EXP2,
    EXPM1,
    GELU,
    GELU_BW,
    GELU_TANH,
    GELU_TANH_BW,
    GLU,
    HYPOT,
    I0,
    LERP,
    LGAMMA,
    LOG,
    LOG1P,
    LOG2,
    LOG10,
    LOGADDEXP,
    LOGSIGMOID,
    LOGSIGMOID_BW,
    MISH,
    MISH_BW,
    POW,
    RSQRT,
    SIGMOID,
    SIGMOID_BW,
    SILU,
    SILU_BW,
    SIN,
    SINH,
    SOFTPLUS,
    SOFTPLUS_BW,
    TAN,
    TANH,
    TANH_BW,
)

if TYPE_CHECKING:
    from .functions import Function


# -- the exact values --------------------------------------------------------------------------------
def _mp():
    try:
        import mpmath
    except ImportError:
        return None
    return mpmath


def _normal_cdf(mp):
    return lambda t: mp.erfc(-t / mp.sqrt(2)) / 2


def _logistic(mp):
    return lambda t: 1 / (1 + mp.exp(-t))


def _exact_mp(mp, fn: Function, xs: tuple[float, ...], ps: tuple[float, ...]):
    """The exact function of exact binary64 values, in mpmath at the current precision."""
    x = [mp.mpf(v) for v in xs]
    p = [mp.mpf(v) for v in ps]
    c = fn.code
    one = {EXP: mp.exp, LOG: mp.log, EXPM1: mp.expm1, LOG1P: mp.log1p, TANH: mp.tanh, ERF: mp.erf, ERFC: mp.erfc,
           ERFINV: mp.erfinv, SIN: mp.sin, COS: mp.cos, TAN: mp.tan, ASIN: mp.asin, ACOS: mp.acos, ATAN: mp.atan,
           SINH: mp.sinh, COSH: mp.cosh, ASINH: mp.asinh, ACOSH: mp.acosh, ATANH: mp.atanh}
    if c in one:
        return one[c](x[0])
    if c == EXP2:
        return mp.power(2, x[0])
    if c == LOG2:
        return mp.log(x[0], 2)
    if c == LOG10:
        return mp.log10(x[0])
    if c == SIGMOID:
        return 1 / (1 + mp.exp(-x[0]))
    if c == RSQRT:
        return 1 / mp.sqrt(x[0])
    if c == LGAMMA:
        return mp.log(abs(mp.gamma(x[0])))
    if c == I0:
        return mp.besseli(0, x[0])
    phi, sig, k1 = _normal_cdf(mp), _logistic(mp), mp.mpf(44715) / 10**6
    if c == GELU:
        return x[0] * phi(x[0])
    if c == GELU_TANH:
        return x[0] * sig(2 * mp.sqrt(2 / mp.pi) * (x[0] + k1 * x[0] ** 3))
    if c == SILU:
        return x[0] * sig(x[0])
    if c == MISH:
        return x[0] * mp.tanh(mp.log1p(mp.exp(x[0])))
    if c == SOFTPLUS:
        return mp.log1p(mp.exp(p[0] * x[0])) / p[0]
    if c == LOGSIGMOID:
        return -mp.log1p(mp.exp(-x[0]))
    if c == ELU:
        return p[0] * p[1] * mp.expm1(p[2] * x[0])
    if c == ATAN2:
        return mp.atan2(x[0], x[1])
    if c == POW:
        return mp.power(abs(x[0]), x[1]) * (-1 if x[0] < 0 and int(x[1]) % 2 else 1)
    if c == HYPOT:
        return mp.sqrt(x[0] ** 2 + x[1] ** 2)
    if c == LOGADDEXP:
        return mp.log(mp.exp(x[0]) + mp.exp(x[1]))
    if c == GLU:
        return x[0] * sig(x[1])
    return _exact_mp_gradient(mp, fn, x, p)


def _exact_mp_gradient(mp, fn: Function, x: list, p: list):
    """The exact gradient functions (``_BW``: the incoming gradient g times the derivative at y), in mpmath."""
    c = fn.code
    phi, sig, k1 = _normal_cdf(mp), _logistic(mp), mp.mpf(44715) / 10**6
    g, y = x[0], x[1] if len(x) > 1 else None
    if c == GELU_BW:
        return g * (phi(y) + y * mp.exp(-y * y / 2) / mp.sqrt(2 * mp.pi))
    if c == GELU_TANH_BW:
        z2 = 2 * mp.sqrt(2 / mp.pi) * (y + k1 * y**3)
        s = sig(z2)
        return g * (s + y * 2 * mp.sqrt(2 / mp.pi) * (1 + 3 * k1 * y * y) * s * (1 - s))
    if c == SILU_BW:
        s = sig(y)
        return g * (s + y * s * (1 - s))
    if c == MISH_BW:
        sp = mp.log1p(mp.exp(y))
        t = mp.tanh(sp)
        return g * (t + y * sig(y) * (1 - t * t))
    if c == SOFTPLUS_BW:
        return g * sig(p[0] * y)
    if c == LOGSIGMOID_BW:
        return g * sig(-y)
    if c == SIGMOID_BW:
        return g * y * (1 - y)
    if c == TANH_BW:
        return g * (1 - y * y)
    if c == ELU_BW:
        if p[3]:
            return g * p[2] * (y + p[0] * p[1])
        return g * p[2] * p[0] * p[1] * mp.exp(p[2] * y)
    raise ValueError(f"{fn.name}: no exact evaluation")


def _exact_rational(fn: Function, xs, ps) -> Fraction:
    x, a, b = (Fraction(v) for v in xs)
    v = Fraction(ps[0]) if ps else None
    if fn.code == ADDCMUL:
        return x + v * a * b
    if fn.code == ADDCDIV:
        return x + v * a / b
    return x + b * (a - x)  # LERP


_DECIMAL = (EXP, LOG, EXP2, LOG2, LOG10)  # the functions with an exact value without mpmath


def _exact_decimal(fn: Function, x: float, bits: int) -> Fraction:
    """exp, log, exp2, log2 and log10 in Python's decimal, its exp, ln and log10 correctly rounded at
    the context's precision (10**-8 below the 2**-(bits - 4) that _settle asks; exp2's rounded argument
    x ln 2, |x| < 2**8 where exp2 is finite and not 0, multiplies the error by at most 2**8)."""
    import decimal

    ctx = decimal.Context(prec=int(bits * 0.30103) + 8, Emax=10**6, Emin=-10**6)
    d = decimal.Decimal(x)
    if fn.code == EXP:
        value = ctx.exp(d)
    elif fn.code == EXP2:
        value = ctx.exp(ctx.multiply(d, ctx.ln(decimal.Decimal(2))))
    elif fn.code == LOG:
        value = ctx.ln(d)
    elif fn.code == LOG2:
        value = ctx.divide(ctx.ln(d), ctx.ln(decimal.Decimal(2)))
    else:
        value = ctx.log10(d)
    return Fraction(value)


# The binary32 rounding boundaries near a value: numbers of 25 significant bits (binary32's
# values and the midpoints between them), spaced 2**-150 below 2**-126.
def _spacing(q: Fraction) -> Fraction:
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    return Fraction(2) ** max(e - 24, -150)


def _cell(q: Fraction) -> tuple[Fraction, bool]:
    """The boundary at or below q (q > 0) and whether q is one."""
    g = _spacing(q)
    k = q // g
    return k * g, k * g == q


def _odd53(q: Fraction) -> float:
    """q rounded to odd at 53 bits (a binary64 number that is no 25-bit number unless q is)."""
    if q == 0:
        return 0.0
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    e = max(e - 52, -1074)
    m = a / Fraction(2) ** e
    k = m.numerator // m.denominator
    if k * Fraction(2) ** e != a:
        k |= 1
    if e > 1023 - 52:
        return math.copysign(_BIG, q)
    return math.copysign(math.ldexp(float(k), e), q)


def _settle(approx: Fraction, rel: Fraction) -> tuple[bool, float]:
    """Whether every value within rel * |approx| of approx lies strictly between the same two
    boundaries, and then a binary64 stand-in for the exact value."""
    if approx == 0:
        return False, 0.0
    a = abs(approx)
    if a >= Fraction(2) ** 128:
        return True, math.copysign(_BIG, approx)
    lo, hi = a * (1 - rel), a * (1 + rel)
    cell, on = _cell(lo)
    if on or lo == 0:
        return False, 0.0
    top, _ = _cell(hi)
    if top != cell:
        return False, 0.0
    return True, _odd53(approx)


def exact_value(fn: Function, xs: tuple[float, ...], ps: tuple[float, ...] = ()) -> float:
    """A binary64 number that rounds as ``fn``'s exact value does into binary32 (in every mode):
    the exact value where it is a boundary (25 significant bits), else one strictly between the
    same two boundaries. For the elements the fast path leaves open: finite operands, a finite
    exact value."""
    if fn.code in (ADDCMUL, ADDCDIV, LERP):
        q = _exact_rational(fn, xs, ps)
        cell, on = (_cell(abs(q)) if q else (0, True))
        if on or abs(q) >= Fraction(2) ** 128:
            return math.copysign(_BIG, q) if abs(q) >= Fraction(2) ** 128 else float(q)
        return _odd53(q)
    if fn.code == POW and xs[1] == math.floor(xs[1]) and abs(xs[1]) <= 64:
        q = Fraction(xs[0]) ** int(xs[1])
        if abs(q) >= Fraction(2) ** 128:
            return math.copysign(_BIG, q)
        _, on = _cell(abs(q))
        return float(q) if on else _odd53(q)
    mp = _mp()
    bits = 80
    last = None
    while bits <= 1280:
        if mp is None:
            if fn.code not in _DECIMAL:
                raise ImportError(f"{fn.name}: the exact value of an element near a binary32 rounding boundary "
                                  f"needs mpmath (pip install mpmath; torch installs it)")
            v = _exact_decimal(fn, xs[0], bits)
        else:
            with mp.workprec(bits + 16):
                m = _exact_mp(mp, fn, xs, ps)
                if not mp.isfinite(m):
                    return float(m)
                num, den = mp.libmp.to_rational(mp.mpf(m)._mpf_)  # exact
                v = Fraction(int(num), int(den))
        last = v
        ok, r = _settle(v, Fraction(1, 2 ** (bits - 4)))
        if ok:
            return r
        bits *= 2
    # Past 1280 bits: the exact value is taken to be the boundary nearest the last approximation.
    a = abs(last)
    g = _spacing(a)
    return math.copysign(float(round(a / g) * g), last)

