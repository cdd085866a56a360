"""The exact value of a hard case, to as many bits as its rounding needs (MPFR through gmpy2 where
installed, else exact rationals and decimals), rounded to odd at 53 bits."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING

from . import compiled as C

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
    one = {C.EXP: mp.exp, C.LOG: mp.log, C.EXPM1: mp.expm1, C.LOG1P: mp.log1p, C.TANH: mp.tanh, C.ERF: mp.erf,
           C.ERFC: mp.erfc, C.ERFINV: mp.erfinv, C.SIN: mp.sin, C.COS: mp.cos, C.TAN: mp.tan, C.ASIN: mp.asin,
           C.ACOS: mp.acos, C.ATAN: mp.atan, C.SINH: mp.sinh, C.COSH: mp.cosh, C.ASINH: mp.asinh, C.ACOSH: mp.acosh,
           C.ATANH: mp.atanh}
    if c in one:
        return one[c](x[0])
    if c == C.EXP2:
        return mp.power(2, x[0])
    if c == C.LOG2:
        return mp.log(x[0], 2)
    if c == C.LOG10:
        return mp.log10(x[0])
    if c == C.SIGMOID:
        return 1 / (1 + mp.exp(-x[0]))
    if c == C.RSQRT:
        return 1 / mp.sqrt(x[0])
    if c == C.LGAMMA:
        return mp.log(abs(mp.gamma(x[0])))
    if c == C.I0:
        return mp.besseli(0, x[0])
    phi, sig, k1 = _normal_cdf(mp), _logistic(mp), mp.mpf(44715) / 10**6
    if c == C.GELU:
        return x[0] * phi(x[0])
    if c == C.GELU_TANH:
        return x[0] * sig(2 * mp.sqrt(2 / mp.pi) * (x[0] + k1 * x[0] ** 3))
    if c == C.SILU:
        return x[0] * sig(x[0])
    if c == C.MISH:
        return x[0] * mp.tanh(mp.log1p(mp.exp(x[0])))
    if c == C.SOFTPLUS:
        return mp.log1p(mp.exp(p[0] * x[0])) / p[0]
    if c == C.LOGSIGMOID:
        return -mp.log1p(mp.exp(-x[0]))
    if c == C.ELU:
        return p[0] * p[1] * mp.expm1(p[2] * x[0])
    if c == C.ATAN2:
        return mp.atan2(x[0], x[1])
    if c == C.POW:
        return mp.power(abs(x[0]), x[1]) * (-1 if x[0] < 0 and int(x[1]) % 2 else 1)
    if c == C.HYPOT:
        return mp.sqrt(x[0] ** 2 + x[1] ** 2)
    if c == C.LOGADDEXP:
        return mp.log(mp.exp(x[0]) + mp.exp(x[1]))
    if c == C.GLU:
        return x[0] * sig(x[1])
    return _exact_mp_gradient(mp, fn, x, p)


def _exact_mp_gradient(mp, fn: Function, x: list, p: list):
    """The exact gradient functions (``_BW``: the incoming gradient g times the derivative at y), in mpmath."""
    c = fn.code
    phi, sig, k1 = _normal_cdf(mp), _logistic(mp), mp.mpf(44715) / 10**6
    g, y = x[0], x[1] if len(x) > 1 else None
    if c == C.GELU_BW:
        return g * (phi(y) + y * mp.exp(-y * y / 2) / mp.sqrt(2 * mp.pi))
    if c == C.GELU_TANH_BW:
        z2 = 2 * mp.sqrt(2 / mp.pi) * (y + k1 * y**3)
        s = sig(z2)
        return g * (s + y * 2 * mp.sqrt(2 / mp.pi) * (1 + 3 * k1 * y * y) * s * (1 - s))
    if c == C.SILU_BW:
        s = sig(y)
        return g * (s + y * s * (1 - s))
    if c == C.MISH_BW:
        sp = mp.log1p(mp.exp(y))
        t = mp.tanh(sp)
        return g * (t + y * sig(y) * (1 - t * t))
    if c == C.SOFTPLUS_BW:
        return g * sig(p[0] * y)
    if c == C.LOGSIGMOID_BW:
        return g * sig(-y)
    if c == C.SIGMOID_BW:
        return g * y * (1 - y)
    if c == C.TANH_BW:
        return g * (1 - y * y)
    if c == C.ELU_BW:
        if p[3]:
            return g * p[2] * (y + p[0] * p[1])
        return g * p[2] * p[0] * p[1] * mp.exp(p[2] * y)
    raise ValueError(f"{fn.name}: no exact evaluation")


def _exact_rational(fn: Function, xs, ps) -> Fraction:
    x, a, b = (Fraction(v) for v in xs)
    v = Fraction(ps[0]) if ps else None
    if fn.code == C.ADDCMUL:
        return x + v * a * b
    if fn.code == C.ADDCDIV:
        return x + v * a / b
    return x + b * (a - x)  # LERP


_DECIMAL = (C.EXP, C.LOG, C.EXP2, C.LOG2, C.LOG10)  # the functions with an exact value without mpmath


def _exact_decimal(fn: Function, x: float, bits: int) -> Fraction:
    """exp, log, exp2, log2 and log10 in Python's decimal, its exp, ln and log10 correctly rounded at
    the context's precision (10**-8 below the 2**-(bits - 4) that _settle asks; exp2's rounded argument
    x ln 2, |x| < 2**8 where exp2 is finite and not 0, multiplies the error by at most 2**8)."""
    import decimal

    ctx = decimal.Context(prec=int(bits * 0.30103) + 8, Emax=10**6, Emin=-10**6)
    d = decimal.Decimal(x)
    if fn.code == C.EXP:
        value = ctx.exp(d)
    elif fn.code == C.EXP2:
        value = ctx.exp(ctx.multiply(d, ctx.ln(decimal.Decimal(2))))
    elif fn.code == C.LOG:
        value = ctx.ln(d)
    elif fn.code == C.LOG2:
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
        return math.copysign(C._BIG, q)
    return math.copysign(math.ldexp(float(k), e), q)


def _settle(approx: Fraction, rel: Fraction) -> tuple[bool, float]:
    """Whether every value within rel * |approx| of approx lies strictly between the same two
    boundaries, and then a binary64 stand-in for the exact value."""
    if approx == 0:
        return False, 0.0
    a = abs(approx)
    if a >= Fraction(2) ** 128:
        return True, math.copysign(C._BIG, approx)
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
    if fn.code in (C.ADDCMUL, C.ADDCDIV, C.LERP):
        q = _exact_rational(fn, xs, ps)
        cell, on = (_cell(abs(q)) if q else (0, True))
        if on or abs(q) >= Fraction(2) ** 128:
            return math.copysign(C._BIG, q) if abs(q) >= Fraction(2) ** 128 else float(q)
        return _odd53(q)
    if fn.code == C.POW and xs[1] == math.floor(xs[1]) and abs(xs[1]) <= 64:
        q = Fraction(xs[0]) ** int(xs[1])
        if abs(q) >= Fraction(2) ** 128:
            return math.copysign(C._BIG, q)
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

