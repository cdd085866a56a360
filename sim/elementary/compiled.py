"""The compiled elementwise functions of one operand: each evaluated in binary64, moved strictly
inside the bounds its exact value obeys, and rounded once to binary32; a case binary64 cannot settle
is marked hard. The codes of every function, and the helpers and the rounding the two- and
three-operand functions (``pairs``) share, are here too.

The loops inline helpers across this package's files and ``sim.kernels``; numba's cache notices an
edit to a loop's own file only, so :mod:`sim.kernels` drops every compiled file's cache together when
any of their sources changes."""

from __future__ import annotations

import math

import numpy as np

from .. import kernels as K

#: The bound assumed on one binary64 libm call's relative error (16 ulps).
LIBM = 2.0**-48
_U = 2.0**-53  # binary64's unit roundoff
_BIG = 1.5 * 2.0**1023  # beyond every binary32 value: rounds to an overflow
_SQRT_PI_2 = math.sqrt(math.pi) / 2
_TWO_SQRT_PI = 2 / math.sqrt(math.pi)
_SQRT1_2 = math.sqrt(0.5)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)
_K0 = math.sqrt(2 / math.pi)  # the tanh approximation of GELU: sqrt(2/pi) (x + 0.044715 x**3)
_K1 = 0.044715
_POW10 = np.array([10.0**k for k in range(23)])  # exact in binary64
_INVALID, _DIVBYZERO, _OVERFLOW = K.INVALID, K.DIVBYZERO, K.OVERFLOW
_HARD = K.HARD
inline = K.inline
jit = K.jit


# -- the functions' codes ----------------------------------------------------------------------
(EXP, LOG, EXPM1, LOG1P, EXP2, LOG2, LOG10, TANH, SIGMOID, ERF, ERFC, ERFINV, RSQRT,
 SIN, COS, TAN, ASIN, ACOS, ATAN, SINH, COSH, ASINH, ACOSH, ATANH, LGAMMA, I0,
 GELU, GELU_TANH, SILU, MISH, SOFTPLUS, LOGSIGMOID, ELU) = range(33)


(ATAN2, POW, HYPOT, GLU, GELU_BW, GELU_TANH_BW, SILU_BW, MISH_BW, SOFTPLUS_BW, LOGSIGMOID_BW,
 ELU_BW, SIGMOID_BW, TANH_BW, LOGADDEXP) = range(100, 114)


ADDCMUL, ADDCDIV, LERP = range(200, 203)


@inline
def _approx(r):
    """A libm result: r, and LIBM of it."""
    return r, LIBM * abs(r), 0


@inline
def _big(r):
    """r where binary64 overflowed (or did not) but the exact value is finite: beyond binary32."""
    return (math.copysign(_BIG, r), 0.0, 0) if math.isinf(r) else _approx(r)


@inline
def _beside(b, toward):
    """The exact value just beside b, towards ``toward``, by less than 2**-26 of b: b's binary64
    neighbour on that side stands for it (no 25-bit number lies between them)."""
    return np.nextafter(b, toward), 0.0, 0


_TINY = 2.0**-28  # below it x**2 < 2**-56: the functions near x (or x/2, 1/2) are beside them


@inline
def _sigmoid(x):
    """sigmoid(x) in binary64 without cancellation: 1 / (1 + e**-x), or e**x / (1 + e**x)."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


@inline
def _softplus(z):
    """log(1 + e**z) without overflow or cancellation."""
    return math.log1p(math.exp(z)) if z <= 0 else z + math.log1p(math.exp(-z))


@inline
def _erfinv(x):
    """erfinv(x) for 0 < |x| < 1 by Newton's method, monotone from a start on the safe side:
    on erf(y) = |x| below 1/2 (erf is concave: from below), on log erfc(y) = log(1 - |x|) above
    (1 - |x| is exact there; log erfc is concave and decreasing: from above). Returns (y, err)."""
    a = abs(x)
    if a < 1e-150:
        return math.copysign(a * _SQRT_PI_2, x), 4 * _U * a
    y = 0.0
    step = 1.0
    small = 0  # steps in a row below 1e-14 y: two more after the first, for the last bits
    if a < 0.5:
        y = a * _SQRT_PI_2 * (1.0 + a * a * (math.pi / 12))  # the series, truncated: below the root
        for _ in range(60):
            step = (math.erf(y) - a) / (_TWO_SQRT_PI * math.exp(-y * y))
            y -= step
            small = small + 1 if abs(step) <= 1e-14 * y else 0
            if small == 3:
                break
    else:
        q = 1.0 - a
        lq = math.log(q)
        y = math.sqrt(-lq)  # erfc(y) <= e**-y**2 = q: at or above the root
        for _ in range(200):
            c = math.erfc(y)
            step = (math.log(c) - lq) * c / (-_TWO_SQRT_PI * math.exp(-y * y))
            y -= step
            small = small + 1 if abs(step) <= 1e-14 * y else 0
            if small == 3:
                break
    err = 4 * LIBM * y + 4 * abs(step) if small == 3 else 1e-6 * y
    return math.copysign(y, x), err


@inline
def _unary(code, x, p0, p1, p2):
    """(r, err, flags) of the one-operand functions, by family."""
    if math.isnan(x):
        return x, 0.0, 0
    if code <= LOG10:
        return _exponentials(code, x)
    if code <= RSQRT:
        return _specials(code, x)
    if code <= ATANH:
        return _circular(code, x)
    if code <= I0:
        return _gamma(code, x)
    if code <= MISH:
        return _gated(code, x)
    return _softplus_family(code, x, p0, p1, p2)


@inline
def _exponentials(code, x):
    """exp, expm1, exp2 and the logarithms (x not NaN)."""
    inf = math.isinf(x)
    if code == EXP:
        if x == 0:
            return 1.0, 0.0, 0
        if inf:
            return (x if x > 0 else 0.0), 0.0, 0
        return _big(math.exp(x))
    if code == EXPM1:
        if x == 0 or (inf and x > 0):
            return x, 0.0, 0
        if inf:
            return -1.0, 0.0, 0
        return _big(math.expm1(x))
    if code == EXP2:
        if inf:
            return (x if x > 0 else 0.0), 0.0, 0
        if x == math.floor(x):  # an integer: a power of two, exactly
            if x >= 1024:  # beyond binary64 too (ldexp would give an infinity, taken as exact)
                return _BIG, 0.0, 0
            return (math.ldexp(1.0, int(x)) if x > -1100 else 5e-324), 0.0, 0
        return _big(2.0**x)
    if code == LOG or code == LOG2 or code == LOG10 or code == LOG1P:
        one = -1.0 if code == LOG1P else 0.0
        if x < one:
            return np.nan, 0.0, _INVALID
        if x == one:
            return -np.inf, 0.0, _DIVBYZERO
        if inf:
            return x, 0.0, 0
        if code == LOG1P:
            return (x, 0.0, 0) if x == 0 else _approx(math.log1p(x))
        if code == LOG:
            return (0.0, 0.0, 0) if x == 1 else _approx(math.log(x))
        if code == LOG2:
            m, e = math.frexp(x)
            return (float(e - 1), 0.0, 0) if m == 0.5 else _approx(math.log2(x))
        k = int(round(math.log10(x)))  # LOG10: an exact power of ten is exact
        if 0 <= k <= 22 and _POW10[k] == x:
            return float(k), 0.0, 0
        return _approx(math.log10(x))
    return np.nan, 0.0, _INVALID


@inline
def _specials(code, x):
    """tanh, sigmoid, erf, erfc, erfinv and rsqrt (x not NaN)."""
    inf = math.isinf(x)
    if code == TANH:
        if x == 0:
            return x, 0.0, 0
        return (math.copysign(1.0, x), 0.0, 0) if inf else _approx(math.tanh(x))
    if code == SIGMOID:
        if x == 0:
            return 0.5, 0.0, 0
        if inf:
            return (1.0 if x > 0 else 0.0), 0.0, 0
        if abs(x) < 2.0**-20:  # 1/2 + x/4 - x**3/48: beside 1/2 + x/4 (exact from 2**-28 up), or 1/2
            if abs(x) < _TINY:
                return _beside(0.5, math.copysign(np.inf, x))
            return _beside(0.5 + 0.25 * x, math.copysign(np.inf, -x))
        r = _sigmoid(x)
        return r, (LIBM + 3 * _U) * r, 0
    if code == ERF:
        if x == 0:
            return x, 0.0, 0
        return (math.copysign(1.0, x), 0.0, 0) if inf else _approx(math.erf(x))
    if code == ERFC:
        if x == 0:
            return 1.0, 0.0, 0
        if inf:
            return (0.0 if x > 0 else 2.0), 0.0, 0
        return _approx(math.erfc(x))
    if code == ERFINV:
        if x == 0:
            return x, 0.0, 0
        a = abs(x)
        if a > 1:
            return np.nan, 0.0, _INVALID
        if a == 1:
            return math.copysign(np.inf, x), 0.0, _DIVBYZERO
        y, err = _erfinv(x)
        return y, err, 0
    if code == RSQRT:
        if x == 0:
            return math.copysign(np.inf, x), 0.0, _DIVBYZERO
        if x < 0:
            return np.nan, 0.0, _INVALID
        if inf:
            return 0.0, 0.0, 0
        return K.rsqrt_value(x, 23), 0.0, 0  # meets the contract for binary32 exactly
    return np.nan, 0.0, _INVALID


@inline
def _circular(code, x):
    """The circular and hyperbolic functions and their inverses (x not NaN)."""
    inf = math.isinf(x)
    if code == SIN or code == TAN or code == ASIN or code == ATAN or code == SINH or code == ASINH \
            or code == ATANH:
        if x == 0:
            return x, 0.0, 0
        if abs(x) < _TINY:  # x + c x**3: beside x, on the side of the correction's sign
            away = code == TAN or code == ASIN or code == SINH or code == ATANH
            return _beside(x, math.copysign(np.inf, x) if away else 0.0)
    if code == SIN or code == COS or code == TAN:
        if inf:
            return np.nan, 0.0, _INVALID
        if code == COS:
            return (1.0, 0.0, 0) if x == 0 else _approx(math.cos(x))
        return _approx(math.sin(x) if code == SIN else math.tan(x))
    if code == ASIN or code == ACOS:
        if abs(x) > 1:
            return np.nan, 0.0, _INVALID
        if code == ACOS:
            return (0.0, 0.0, 0) if x == 1 else _approx(math.acos(x))
        return _approx(math.asin(x))
    if code == ATAN:
        return _approx(math.atan(x))
    if code == SINH or code == COSH:
        if inf:
            return (x if code == SINH else np.inf), 0.0, 0
        if code == COSH and x == 0:
            return 1.0, 0.0, 0
        return _big(math.sinh(x) if code == SINH else math.cosh(x))
    if code == ASINH:
        return (x, 0.0, 0) if inf else _approx(math.asinh(x))
    if code == ACOSH:
        if x < 1:
            return np.nan, 0.0, _INVALID
        if x == 1:
            return 0.0, 0.0, 0
        return (x, 0.0, 0) if inf else _approx(math.acosh(x))
    if code == ATANH:
        if abs(x) > 1:
            return np.nan, 0.0, _INVALID
        if abs(x) == 1:
            return math.copysign(np.inf, x), 0.0, _DIVBYZERO
        return _approx(math.atanh(x))
    return np.nan, 0.0, _INVALID


@inline
def _gamma(code, x):
    """lgamma and the Bessel function I0 (x not NaN)."""
    inf = math.isinf(x)
    if code == LGAMMA:
        if inf:
            return np.inf, 0.0, 0
        if x <= 0 and x == math.floor(x):
            return np.inf, 0.0, _DIVBYZERO  # a pole of Gamma
        if x == 1 or x == 2:
            return 0.0, 0.0, 0
        r = math.lgamma(x)
        if math.isinf(r):
            return _BIG, 0.0, 0
        return r, 16 * LIBM * abs(r), 0
    if code == I0:
        a = abs(x)
        if inf or a > 100:  # I0(100) > 1e42: beyond binary32
            return (np.inf, 0.0, 0) if inf else (_BIG, 0.0, 0)
        q = a * a * 0.25  # exact
        term, total, k = 1.0, 1.0, 1.0
        while term > total * 1e-18:  # positive terms, no cancellation
            term *= q / (k * k)
            total += term
            k += 1.0
        return total, (a + 16) * 4 * _U * total, 0
    return np.nan, 0.0, _INVALID


@inline
def _gated(code, x):
    """The gated activations: GELU (exact and tanh), SiLU and Mish (x not NaN)."""
    inf = math.isinf(x)
    if code == GELU:  # x * Phi(x)
        if x == 0:
            return x, 0.0, 0
        if inf:
            return (x, 0.0, 0) if x > 0 else (np.nan, 0.0, _INVALID)  # torch: -inf * 0
        if abs(x) < _TINY:  # x/2 + x**2 / sqrt(2 pi): above x/2
            return _beside(0.5 * x, np.inf)
        if x > 0:
            r = 0.5 * x * (1.0 + math.erf(x * _SQRT1_2))
            return r, (LIBM + 6 * _U) * r, 0
        t = -x * _SQRT1_2  # rounded: erfc's condition 2t**2 + 1 amplifies it
        r = 0.5 * x * math.erfc(t)
        return r, (LIBM + (2 * t * t + 4) * 2 * _U) * abs(r), 0
    if code == GELU_TANH:  # 0.5 x (1 + tanh(k0 (x + k1 x**3))) = x * sigmoid(2 z)
        if x == 0:
            return x, 0.0, 0
        if inf:
            return (x, 0.0, 0) if x > 0 else (np.nan, 0.0, _INVALID)
        if abs(x) < _TINY:  # x/2 + k0 x**2 / 2: above x/2
            return _beside(0.5 * x, np.inf)
        z2 = 2.0 * _K0 * (x + _K1 * (x * x * x))
        r = x * _sigmoid(z2)  # sigmoid's condition at u: u sigmoid(-u)
        return r, (2 * LIBM + (abs(z2) * _sigmoid(-z2) + 2) * 8 * _U) * abs(r), 0
    if code == SILU:  # x * sigmoid(x)
        if x == 0:
            return x, 0.0, 0
        if inf:
            return (x, 0.0, 0) if x > 0 else (np.nan, 0.0, _INVALID)
        if abs(x) < _TINY:  # x/2 + x**2/4: above x/2
            return _beside(0.5 * x, np.inf)
        r = x * _sigmoid(x)
        return r, (LIBM + 4 * _U) * abs(r), 0
    if code == MISH:  # x tanh(softplus x) = x n / (n + 2), n = w (w + 2), w = e**x
        if x == 0:
            return x, 0.0, 0
        if inf:
            return (x, 0.0, 0) if x > 0 else (np.nan, 0.0, _INVALID)
        if x > 30:
            return x, 4 * _U * x, 0  # short of x by about 2x e**-2x
        w = math.exp(x)
        n = w * (w + 2.0)
        r = x * n / (n + 2.0)
        return r, (2 * LIBM + 8 * _U) * abs(r), 0
    return np.nan, 0.0, _INVALID


@inline
def _softplus_family(code, x, p0, p1, p2):
    """softplus, logsigmoid and ELU, with their parameters p0, p1, p2 as their functions say
    (binary32 values; x not NaN)."""
    inf = math.isinf(x)
    if code == SOFTPLUS:  # beta p0, threshold p1: x where beta x > threshold
        z = p0 * x  # exact (binary32 times a binary32-or-narrower value)
        if z > p1:
            return x, 0.0, 0
        if inf:
            return 0.0, 0.0, 0  # x = -inf (beta > 0)
        r = _softplus(z) / p0
        return r, (2 * LIBM + 4 * _U) * abs(r), 0
    if code == LOGSIGMOID:  # -softplus(-x)
        if inf:
            return (x, 0.0, 0) if x < 0 else (-0.0, 0.0, 0)
        r = -_softplus(-x)
        return r, (2 * LIBM + 4 * _U) * abs(r), 0
    if code == ELU:  # alpha p0, scale p1, input_scale p2: scale x above 0, else alpha scale (e**(is x) - 1)
        if x > 0:
            return p1 * x, 0.0, 0  # exact
        if x == 0:  # torch gives scale x for either zero, whatever alpha (measured: every dtype, both ISAs)
            return x * p1, 0.0, 0
        if inf:
            return -(p0 * p1), 0.0, 0
        a, z = p0 * p1, p2 * x  # exact
        if abs(z) < _TINY:  # a (z + z**2/2): beside a z where that product is exact (a boundary, maybe)
            hi = a * z
            if K.fma64(a, z, -hi) == 0:
                return _beside(hi, np.inf if a > 0 else -np.inf)
        r = a * math.expm1(z)
        return r, (LIBM + 3 * _U) * abs(r), 0
    return np.nan, 0.0, _INVALID


# -- the loops -----------------------------------------------------------------------------------
@inline
def _round32(r):
    """r rounded to binary32 to nearest even (the IEEE conversion of every CPU): its bits, and
    OVERFLOW where a finite r rounds to an infinity; a NaN as the canonical quiet NaN."""
    if r != r:
        return np.uint32(0x7FC00000), 0
    f = np.float32(r)
    return K.f32_bits(f), _OVERFLOW if math.isinf(f) and not math.isinf(r) else 0


@inline
def _accept(r, err, fl):
    """round(r) into binary32 where every value within err of r rounds alike: (bits, flags);
    flags HARD where they do not."""
    if err == 0:
        bits, f = _round32(r)
        return bits, f | fl
    err = err * 1.001 + abs(r) * 2.3e-16  # the bound's own roundings
    lo, f = _round32(r - err)
    hi, _ = _round32(r + err)
    return lo, (f | fl) if lo == hi else _HARD


@jit
def unary(code, x, out, flags, params):
    """out = RN32(f(x)) for the one-operand functions (x: binary64 values), each element's flags
    (HARD: not decided; the caller finds its exact value). Returns how many are HARD."""
    p0, p1, p2 = params[0], params[1], params[2]
    hard = 0
    for i in range(x.size):
        r, err, fl = _unary(code, x[i], p0, p1, p2)
        out[i], flags[i] = _accept(r, err, fl)
        hard += flags[i] == _HARD
    return hard
